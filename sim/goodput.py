"""sim/goodput.py — goodput, the highest request rate at which a cluster meets
its SLO attainment target, from attainment measured at several rates: the rule
that bench/scale/procs reports and tests/integration/scale_procs_test.py checks
(docs/scale-topology.md)."""


def goodput(points, target):
    """The highest rate meeting the target: between the highest passing rate
    and the next failing one, where the attainment line crosses the target
    (linear); the highest rate tried when every rate passes; 0 when none.
    points: [{"rate": r, "attainment": a}, ...] in any order."""
    pts = sorted((p["rate"], p["attainment"]) for p in points)
    best = 0.0
    for i, (r, a) in enumerate(pts):
        if a >= target:
            best = r
            if i + 1 < len(pts) and pts[i + 1][1] < target:
                r2, a2 = pts[i + 1]
                best = r + (r2 - r) * (a - target) / (a - a2)
    return best
