/* tests/weights/bench_weights.c — timings quoted in docs/weights.md: opening a
 * checkpoint with as many tensors as DeepSeek-V4.1-Flash (index + shards), and
 * the dequantization and quantization rates of each release layout.
 * Usage: bench_weights SCRATCH_DIR (writes ~20 MB there, removes nothing). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "quant.h"
#include "safetensors.h"
#include "tensor2d.h"

int
main(int argc, char **argv)
{
    enum { LAYERS = 40, EXPERTS = 384, R = 4096, C = 4096 };
    char path[1024], name[128];
    td_st_writer_t *w;
    td_st_t *st;
    double t0, t1;
    static const uint8_t tiny[64];
    const int64_t shp[2] = {4, 4};
    float *x, *y;
    uint8_t *q, *s;

    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    td_log_set_level(TD_LOG_ERROR);

    /* 40 layers x 384 experts x (3 weights + 3 scales) = 92160 tensors */
    snprintf(path, sizeof(path), "%s/many", argv[1]);
    if (td_st_writer_create_sharded(path, 64 << 10, &w) != TD_OK)
        return 1;
    for (int l = 0; l < LAYERS; l++) {
        for (int e = 0; e < EXPERTS; e++) {
            static const char *const parts[6] = {"w1.weight", "w1.scale", "w2.weight",
                                                 "w2.scale", "w3.weight", "w3.scale"};
            for (int k = 0; k < 6; k++) {
                snprintf(name, sizeof(name), "layers.%d.ffn.experts.%d.%s", l, e, parts[k]);
                if (td_st_writer_add(w, name, TD_DT_U8, 2, shp, tiny, 16) != TD_OK)
                    return 1;
            }
        }
    }
    if (td_st_writer_finish(w, NULL) != TD_OK)
        return 1;
    t0 = td_clock_s();
    if (td_st_open(path, &st) != TD_OK)
        return 1;
    t1 = td_clock_s();
    printf("open: %zu tensors in sharded checkpoint: %.1f ms\n", td_st_count(st), (t1 - t0) * 1e3);
    t0 = td_clock_s();
    for (int i = 0; i < 100000; i++) {
        snprintf(name, sizeof(name), "layers.%d.ffn.experts.%d.w2.scale", i % LAYERS, i % EXPERTS);
        if (td_st_find(st, name) == NULL)
            return 1;
    }
    t1 = td_clock_s();
    printf("find: %.0f ns per lookup\n", (t1 - t0) * 1e9 / 100000);
    td_st_close(st);

    x = malloc((size_t)R * C * sizeof(float));
    y = malloc((size_t)R * C * sizeof(float));
    q = malloc((size_t)R * C);
    s = malloc((size_t)R * C / 32);
    for (int64_t i = 0; i < (int64_t)R * C; i++)
        x[i] = (float)((i * 2654435761u) % 1000) * 1e-4f - 0.05f;

    t0 = td_clock_s();
    td_quant_fp8_block(x, R, C, 32, 32, q, s);
    t1 = td_clock_s();
    printf("quantize fp8 32x32 [%d,%d]: %.0f M elements/s\n", R, C, (double)R * C / (t1 - t0) / 1e6);
    {
        td_st_tensor_t tw = tensor2d("w", TD_DT_F8_E4M3, R, C, q);
        td_st_tensor_t ts = tensor2d("s", TD_DT_E8M0, R / 32, C / 32, s);
        t0 = td_clock_s();
        td_quant_dequant(&tw, &ts, 0, 0, y);
        t1 = td_clock_s();
        printf("dequant fp8 32x32 [%d,%d]: %.0f M elements/s\n", R, C, (double)R * C / (t1 - t0) / 1e6);
    }
    t0 = td_clock_s();
    td_quant_fp4_group(x, R, C, q, s);
    t1 = td_clock_s();
    printf("quantize fp4 1x32 [%d,%d]: %.0f M elements/s\n", R, C, (double)R * C / (t1 - t0) / 1e6);
    {
        td_st_tensor_t tw = tensor2d("e", TD_DT_I8, R, C / 2, q);
        td_st_tensor_t ts = tensor2d("s", TD_DT_E8M0, R, C / 32, s);
        t0 = td_clock_s();
        td_quant_dequant(&tw, &ts, 0, 0, y);
        t1 = td_clock_s();
        printf("dequant fp4 1x32 [%d,%d]: %.0f M elements/s\n", R, C, (double)R * C / (t1 - t0) / 1e6);
    }
    free(x);
    free(y);
    free(q);
    free(s);
    return 0;
}
