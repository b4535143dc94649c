"""bench/scale/pngplot.py — line plots as PNG files with nothing but the
standard library (zlib): the project's Python has no matplotlib. A 5x7
bitmap font (upper case, digits, a few signs), axes with round ticks, a
linear or log x axis, dashed reference lines, a legend."""
import math
import struct
import zlib

_FONT = {  # 7 rows of 5 columns, '#' set
    "0": ".###.#...##..###.#.###..##...#.###.", "1": "..#...##....#....#....#....#...###.",
    "2": ".###.#...#....#...#...#...#...#####", "3": "#####...#...#.....#.....##...#.###.",
    "4": "...#...##..#.#.#..#.#####...#....#.", "5": "######....####.....#....##...#.###.",
    "6": "..##..#...#....####.#...##...#.###.", "7": "#####....#...#...#...#....#....#...",
    "8": ".###.#...##...#.###.#...##...#.###.", "9": ".###.#...##...#.####....#...#..##..",
    "A": ".###.#...##...#######...##...##...#", "B": "####.#...##...#####.#...##...#####.",
    "C": ".###.#...##....#....#....#...#.###.", "D": "###..#..#.#...##...##...##..#.###..",
    "E": "######....#....####.#....#....#####", "F": "######....#....####.#....#....#....",
    "G": ".###.#...##....#.####...##...#.####", "H": "#...##...##...#######...##...##...#",
    "I": ".###...#....#....#....#....#...###.", "J": "..###...#....#....#....##..#..##...",
    "K": "#...##..#.#.#..##...#.#..#..#.#...#", "L": "#....#....#....#....#....#....#####",
    "M": "#...###.###.#.##.#.##...##...##...#", "N": "#...##...###..##.#.##..###...##...#",
    "O": ".###.#...##...##...##...##...#.###.", "P": "####.#...##...#####.#....#....#....",
    "Q": ".###.#...##...##...##.#.##..#..##.#", "R": "####.#...##...#####.#.#..#..#.#...#",
    "S": ".####.....#.....###.....#....#####.", "T": "#####..#....#....#....#....#....#..",
    "U": "#...##...##...##...##...##...#.###.", "V": "#...##...##...##...##...#.#.#...#..",
    "W": "#...##...##...##.#.##.#.##.#.#.#.#.", "X": "#...##...#.#.#...#...#.#.#...##...#",
    "Y": "#...##...#.#.#...#....#....#....#..", "Z": "#####....#...#...#...#...#....#####",
    " ": "." * 35, ".": "." * 25 + "..##...##.", ",": "." * 25 + "..##...#..",
    "-": "." * 15 + "#####" + "." * 15, "+": "..#....#..#####..#....#.." + "." * 10,
    ":": "......##...##........##...##.......", "/": "....#....#...#...#...#...#....#....",
    "(": "...#...#...#....#....#.....#.....#.", ")": ".#.....#.....#....#....#...#...#...",
    ";": "......##...##........##....#...#...",
    "=": "." * 10 + "#####.....#####" + "." * 10, "%": "##...##..#...#...#...#...#..##...##",
    "_": "." * 30 + "#####", "<": "...#...#...#...#.....#.....#.....#.", ">": ".#.....#.....#.....#...#...#...#...",
    "*": ".....#.#.#.###.#####.###.#.#.#.....", "x": "." * 5 + "#...#.#.#...#...#.#.#...#" + "." * 5,
}
assert all(len(g) == 35 for g in _FONT.values()), [k for k, g in _FONT.items() if len(g) != 35]
COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
          (140, 86, 75)]


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def set(self, x, y, c):
        x, y = int(round(x)), int(round(y))
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def line(self, x0, y0, x1, y1, c, width=1, dash=0):
        n = int(max(abs(x1 - x0), abs(y1 - y0), 1))
        for i in range(n + 1):
            if dash and (i // dash) % 2:
                continue
            x, y = x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n
            for dx in range(width):
                for dy in range(width):
                    self.set(x + dx - width // 2, y + dy - width // 2, c)

    def rect(self, x0, y0, x1, y1, c):
        for y in range(int(y0), int(y1) + 1):
            for x in range(int(x0), int(x1) + 1):
                self.set(x, y, c)

    def text(self, x, y, s, c=(0, 0, 0), scale=2, anchor="left", vertical=False):
        s = s.upper()
        adv = 6 * scale
        if anchor == "center":
            off = -len(s) * adv / 2.0
        elif anchor == "right":
            off = -len(s) * adv
        else:
            off = 0
        for k, ch in enumerate(s):
            g = _FONT.get(ch, _FONT["*"]).ljust(35, ".")
            for r in range(7):
                for col in range(5):
                    if g[r * 5 + col] == "#":
                        for a in range(scale):
                            for b in range(scale):
                                u, v = off + k * adv + col * scale + a, r * scale + b
                                if vertical:
                                    self.set(x + v, y - u, c)
                                else:
                                    self.set(x + u, y + v, c)

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3])
                       for y in range(self.h))
        chunk = lambda t, d: (struct.pack(">I", len(d)) + t + d +
                              struct.pack(">I", zlib.crc32(t + d) & 0xffffffff))
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" +
                    chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)) +
                    chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _ticks(lo, hi, n=6):
    span = hi - lo
    if span <= 0:
        return [lo]
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    t = math.ceil(lo / step) * step
    out = []
    while t <= hi + step * 1e-9:
        out.append(round(t, 12))
        t += step
    return out


def _label(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.001:
        return "%.0e" % v
    return ("%.4f" % v).rstrip("0").rstrip(".")


def plot(path, lines, xlabel, ylabel, title, vline=None, hline=None, markers=False,
         logx=False, ymin=None, ymax=None, legend="top", w=760, h=500):
    """lines: [(label, [(x, y), ...])]; writes path (PNG). legend: "top" or
    "bottom" (right side)."""
    pts = [p for _, ps in lines for p in ps]
    if logx:
        pts = [p for p in pts if p[0] > 0]
    if not pts:
        pts = [(0, 0), (1, 1)]
    xs = [p[0] for p in pts] + ([vline] if vline else [])
    ys = [p[1] for p in pts] + ([hline] if hline is not None else [])
    x0, x1 = min(xs), max(xs)
    y0 = min(ys) if ymin is None else ymin
    y1 = max(ys) if ymax is None else ymax
    if logx:
        x0, x1 = math.log10(x0), math.log10(x1)
        x0, x1 = math.floor(x0 * 2) / 2, math.ceil(x1 * 2) / 2
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    if not logx:
        pad = (x1 - x0) * 0.05
        x0, x1 = (x0 - pad if x0 - pad > 0 or x0 < 0 else 0), x1 + pad
    L, R, T, B = 90, 20, 40, 60
    c = Canvas(w, h)
    fx = lambda x: L + ((math.log10(x) if logx else x) - x0) / (x1 - x0) * (w - L - R)
    fy = lambda y: h - B - (y - y0) / (y1 - y0) * (h - T - B)
    grey, black = (225, 225, 225), (0, 0, 0)
    yt = _ticks(y0, y1)
    for t in yt:
        c.line(L, fy(t), w - R, fy(t), grey)
        c.text(L - 6, fy(t) - 7, _label(t), anchor="right")
    xt = ([10 ** e for e in range(math.ceil(x0), math.floor(x1) + 1)] if logx else
          _ticks(x0, x1))
    for t in xt:
        c.line(fx(t), T, fx(t), h - B, grey)
        c.text(fx(t), h - B + 8, _label(t), anchor="center")
    c.line(L, h - B, w - R, h - B, black)
    c.line(L, T, L, h - B, black)
    c.text((L + w - R) / 2, h - 24, xlabel, anchor="center")
    c.text(8, (T + h - B) / 2, ylabel, anchor="center", vertical=True)
    c.text(w / 2, 10, title, anchor="center")
    if vline:
        c.line(fx(vline), T, fx(vline), h - B, (90, 90, 90), dash=6)
    if hline is not None:
        c.line(L, fy(hline), w - R, fy(hline), (90, 90, 90), dash=6)
    for k, (label, ps) in enumerate(lines):
        col = COLORS[k % len(COLORS)]
        ps = [p for p in ps if p[0] > 0] if logx else ps
        for (a, b), (p, q) in zip(ps, ps[1:]):
            c.line(fx(a), fy(b), fx(p), fy(q), col, width=2)
        if markers or len(ps) == 1:
            for a, b in ps:
                c.rect(fx(a) - 3, fy(b) - 3, fx(a) + 3, fy(b) + 3, col)
        ly = (T + 8 + 20 * k if legend == "top" else h - B - 12 - 20 * (len(lines) - k))
        c.rect(w - R - 200, ly + 4, w - R - 180, ly + 8, col)
        c.text(w - R - 172, ly, label)
    c.png(path)
