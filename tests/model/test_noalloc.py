"""tests/model/test_noalloc.py — the forward pass allocates nothing: the
object file of model/forward.c in the td_model library references none of
malloc, calloc, realloc, aligned_alloc or free (its workspace comes from
model/fwspace.c, sized before each pass).

  test_noalloc.py NM LIBTD_MODEL.a"""
import subprocess
import sys

BANNED = {"malloc", "calloc", "realloc", "aligned_alloc", "free", "posix_memalign", "strdup"}


def main():
    nm, lib = sys.argv[1], sys.argv[2]
    out = subprocess.run([nm, "-u", lib], check=True, capture_output=True, text=True).stdout
    member, undef = None, {}
    for line in out.splitlines():
        if line.endswith(".o:"):
            member = line[:-1]
            undef[member] = set()
        elif line.strip() and member is not None:
            undef[member].add(line.split()[-1].split("@")[0])
    fw = [k for k in undef if k.endswith("forward.c.o")]
    if len(fw) != 1:
        sys.exit("test_noalloc: no single forward.c.o in %s (%s)" % (lib, sorted(undef)))
    bad = sorted(undef[fw[0]] & BANNED)
    if bad:
        sys.exit("test_noalloc: %s references %s" % (fw[0], ", ".join(bad)))
    if not undef[fw[0]]:
        sys.exit("test_noalloc: %s references nothing: not the object file" % fw[0])
    print("test_noalloc: %s references none of %s (%d other symbols)" %
          (fw[0], ", ".join(sorted(BANNED)), len(undef[fw[0]])))


if __name__ == "__main__":
    main()
