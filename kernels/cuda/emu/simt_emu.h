/* kernels/cuda/emu/simt_emu.h — the SIMT emulation's controls, for tests and
 * tools (C), and what its own files share (C++): running a grid, logging a
 * report. The kernel side is include/td_simt_device.h. */
#ifndef TD_SIMT_EMU_H
#define TD_SIMT_EMU_H

#ifdef __cplusplus
extern "C" {
#endif

/* Host threads that run a launch's blocks (the waiting thread included):
 * 1 .. 256; before this call, $TD_SIMT_THREADS or the online CPUs. */
void td_simt_set_threads(unsigned n);
/* The shared-memory race check on or off (default: on, or $TD_SIMT_RACECHECK). */
void td_simt_set_racecheck(int on);
/* Reports made by the bug catchers since the process started. */
unsigned long td_simt_reports(void);
/* Kernel launches run since the process started. */
unsigned long td_simt_launches(void);

/* Send the emulation's error lines (bug reports, refused calls) to fn
 * instead of td_base's log; NULL restores the log. For tests: set it while
 * no kernel runs. */
typedef void (*td_simt_line_fn)(const char *line, void *arg);
void td_simt_capture(td_simt_line_fn fn, void *arg);
/* One error line: to the capture, else td_base's log (report_log.c). */
void td_simt_emit(const char *line);
void td_simt_log_error(const char *line);

#ifdef __cplusplus
}

namespace td_simt {
struct launch_desc;
}
/* Run the grid now (simt.cc); the number of reports its blocks made. */
unsigned td_simt_run_grid(const td_simt::launch_desc &L);
#endif

#endif
