#!/usr/bin/env python3
"""Draw Seedbar's icons (our own art) into icons/: the app icon set and the tray icons.

Pure standard library: shapes are signed distance functions rendered with analytic
anti-aliasing at every size (no downscaling), written as PNG, ICO (PNG entries) and ICNS.
Run: python3 scripts/make-icons.py  (the outputs are committed).
"""

import math
import os
import struct
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "icons")


# Shapes: functions of (x, y) in canvas units (0..1, y down) -> signed distance (< 0 inside).

def rounded_square(cx, cy, half, radius):
    def sdf(x, y):
        qx = abs(x - cx) - (half - radius)
        qy = abs(y - cy) - (half - radius)
        outside = math.hypot(max(qx, 0.0), max(qy, 0.0))
        return outside + min(max(qx, qy), 0.0) - radius
    return sdf


def almond(cx, cy, length, width, angle):
    """A seed: the lens where two circles meet, `length` tip to tip, rotated by `angle`."""
    h, w = length / 2, width / 2
    # Circles of radius r centred at (+-d, 0) meet at (0, +-h) and cross x = 0 ... w.
    r = (h * h + w * w) / (2 * w)
    d = r - w
    ca, sa = math.cos(angle), math.sin(angle)

    def sdf(x, y):
        px, py = x - cx, y - cy
        lx, ly = ca * px + sa * py, -sa * px + ca * py
        return max(math.hypot(lx - d, ly) - r, math.hypot(lx + d, ly) - r)
    return sdf


def groove(cx, cy, length, thickness, angle, bend):
    """A bent line along a seed's long axis."""
    ca, sa = math.cos(angle), math.sin(angle)
    h = length / 2
    # An arc through (0, -h), (bend, 0), (0, h): a circle centred on the x axis.
    rc = (h * h + bend * bend) / (2 * bend)
    ccx = bend - rc

    def sdf(x, y):
        px, py = x - cx, y - cy
        lx, ly = ca * px + sa * py, -sa * px + ca * py
        if abs(ly) > h or (lx - ccx) * bend < 0:
            # Round ends past the arc's tips (and nothing of the circle's far side).
            tip_y = h if ly > 0 else -h
            return math.hypot(lx, ly - tip_y) - thickness / 2
        return abs(math.hypot(lx - ccx, ly) - abs(rc)) - thickness / 2
    return sdf


def union(*sdfs):
    return lambda x, y: min(f(x, y) for f in sdfs)


def subtract(a, b):
    return lambda x, y: max(a(x, y), -b(x, y))


# Rendering.

def coverage(sdf, x, y, px):
    """Area of the pixel inside the shape, from the distance (one pixel wide ramp)."""
    return min(1.0, max(0.0, 0.5 - sdf(x, y) / px))


def render(size, layers):
    """layers: [(sdf, colour(x, y) -> (r, g, b, a) in 0..1)] painted in order."""
    px = 1.0 / size
    rows = []
    for j in range(size):
        y = (j + 0.5) * px
        row = bytearray()
        for i in range(size):
            x = (i + 0.5) * px
            r = g = b = a = 0.0  # premultiplied
            for sdf, colour in layers:
                c = coverage(sdf, x, y, px)
                if c <= 0.0:
                    continue
                cr, cg, cb, ca = colour(x, y)
                ca *= c
                r = cr * ca + r * (1 - ca)
                g = cg * ca + g * (1 - ca)
                b = cb * ca + b * (1 - ca)
                a = ca + a * (1 - ca)
            if a > 0:
                r, g, b = r / a, g / a, b / a
            row += bytes(round(255 * min(1.0, max(0.0, v))) for v in (r, g, b, a))
        rows.append(bytes(row))
    return rows


def png(rows):
    height, width = len(rows), len(rows[0]) // 4
    raw = b"".join(b"\x00" + row for row in rows)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def ico(pngs):
    """pngs: {size: png bytes}; PNG entries (Windows Vista and later)."""
    sizes = sorted(pngs)
    out = struct.pack("<HHH", 0, 1, len(sizes))
    offset = 6 + 16 * len(sizes)
    data = b""
    for s in sizes:
        blob = pngs[s]
        out += struct.pack("<BBBBHHII", s % 256, s % 256, 0, 0, 1, 32, len(blob), offset)
        offset += len(blob)
        data += blob
    return out + data


ICNS_TYPES = [  # (type, pixels)
    (b"icp4", 16), (b"icp5", 32), (b"ic11", 32), (b"ic12", 64), (b"ic07", 128),
    (b"ic13", 256), (b"ic08", 256), (b"ic14", 512), (b"ic09", 512), (b"ic10", 1024),
]


def icns(pngs):
    body = b"".join(kind + struct.pack(">I", 8 + len(pngs[s])) + pngs[s] for kind, s in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(body)) + body


# The art.

def hex_colour(value, alpha=1.0):
    value = value.lstrip("#")
    return tuple(int(value[i:i + 2], 16) / 255 for i in (0, 2, 4)) + (alpha,)


def flat(value, alpha=1.0):
    c = hex_colour(value, alpha)
    return lambda x, y: c


def vertical(top, bottom):
    a, b = hex_colour(top), hex_colour(bottom)
    return lambda x, y: tuple(a[k] + (b[k] - a[k]) * y for k in range(4))


SEED_ANGLE = math.radians(38)
LEAF_ANGLE = math.radians(40)


def sprout(cx, cy, length, width, leaf_length, leaf_width, gap, groove_width):
    """A seed tilted right with a leaf growing from its upper tip: (seed, groove, leaf)."""
    h = length / 2
    sa, ca = math.sin(SEED_ANGLE), math.cos(SEED_ANGLE)
    tip_x, tip_y = cx + sa * h, cy - ca * h
    dx, dy = math.sin(LEAF_ANGLE), -math.cos(LEAF_ANGLE)
    along = gap + leaf_length / 2
    return (
        almond(cx, cy, length, width, SEED_ANGLE),
        groove(cx, cy, length * 0.6, groove_width, SEED_ANGLE, -width * 0.14),
        almond(tip_x + dx * along, tip_y + dy * along, leaf_length, leaf_width, LEAF_ANGLE),
    )


SEED, GROOVE, LEAF = sprout(0.46, 0.57, 0.54, 0.33, 0.2, 0.095, 0.0, 0.026)
# The tray glyph fills its square (menu bars are short): the same sprout, larger, with a
# gap so the leaf stays apart at 16 px.
SEED_TRAY, GROOVE_TRAY, LEAF_TRAY = sprout(0.41, 0.6, 0.74, 0.44, 0.3, 0.15, 0.05, 0.075)


def app_icon_layers():
    # macOS grid: an 824 px rounded square on a 1024 px canvas.
    plate = rounded_square(0.5, 0.5, 0.4023, 0.1811)
    shadow = rounded_square(0.5, 0.512, 0.4023, 0.1811)
    return [
        (lambda x, y: shadow(x, y) - 0.006, flat("#000000", 0.22)),
        (plate, vertical("#2f9a62", "#12553f")),
        (lambda x, y: max(SEED(x - 0.008, y - 0.014), plate(x, y)), flat("#0b3a2b", 0.35)),
        (SEED, vertical("#fff8e4", "#ead9a6")),
        (GROOVE, flat("#b89a52")),
        (LEAF, flat("#bff0a8")),
    ]


def tray_layers(colour):
    seed = subtract(SEED_TRAY, GROOVE_TRAY)
    if colour:
        return [(SEED_TRAY, flat("#f3e3b3")), (GROOVE_TRAY, flat("#7a6130")), (LEAF_TRAY, flat("#7fd66a"))]
    return [(union(seed, LEAF_TRAY), flat("#000000"))]


def main():
    os.makedirs(OUT, exist_ok=True)
    layers = app_icon_layers()
    app = {}
    for size in sorted({16, 24, 32, 48, 64, 128, 256, 512, 1024}):
        app[size] = png(render(size, layers))
        print(f"app icon {size}px", file=sys.stderr)
    files = {
        "32x32.png": app[32],
        "128x128.png": app[128],
        "128x128@2x.png": app[256],
        "icon.png": app[512],
        "icon.ico": ico({s: app[s] for s in (16, 24, 32, 48, 64, 256)}),
        "icon.icns": icns(app),
    }
    for size, suffix in ((16, ""), (32, "@2x")):
        files[f"tray-template-16{suffix}.png"] = png(render(size, tray_layers(False)))
    for size, suffix in ((32, ""), (64, "@2x")):
        files[f"tray-template-32{suffix}.png"] = png(render(size, tray_layers(False)))
        files[f"tray-color-32{suffix}.png"] = png(render(size, tray_layers(True)))
    for name, data in files.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"icons/{name} ({len(data)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
