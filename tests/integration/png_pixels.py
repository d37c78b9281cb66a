"""Decode an 8-bit RGB/RGBA PNG with zlib and struct only (no imaging dependency), enough to
count pixels of a colour in a browser screenshot."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def rows(data: bytes) -> tuple[int, int, int, Iterator[bytes]]:
    """(width, height, bytes per pixel, iterator of unfiltered rows). Raises ValueError for a
    PNG that is not 8-bit RGB or RGBA, non-interlaced."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    if header is None:
        raise ValueError("no IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp

    def unfiltered() -> Iterator[bytes]:
        prev = bytearray(stride)
        for y in range(height):
            ftype = raw[y * (stride + 1)]
            line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
            if ftype == 1:
                for i in range(bpp, stride):
                    line[i] = (line[i] + line[i - bpp]) & 0xFF
            elif ftype == 2:
                line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
            elif ftype == 3:
                for i in range(stride):
                    left = line[i - bpp] if i >= bpp else 0
                    line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
            elif ftype == 4:
                for i in range(stride):
                    left = line[i - bpp] if i >= bpp else 0
                    upleft = prev[i - bpp] if i >= bpp else 0
                    line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
            yield bytes(line)
            prev = line

    return width, height, bpp, unfiltered()


def count_colour(data: bytes, rgb: tuple[int, int, int], tolerance: int = 24) -> tuple[int, int]:
    """(pixels within ``tolerance`` of ``rgb`` per channel, distinct colours seen, capped)."""
    _, _, bpp, it = rows(data)
    r0, g0, b0 = rgb
    hits, colours = 0, set()
    for line in it:
        for i in range(0, len(line), bpp):
            r, g, b = line[i], line[i + 1], line[i + 2]
            if abs(r - r0) <= tolerance and abs(g - g0) <= tolerance and abs(b - b0) <= tolerance:
                hits += 1
            if len(colours) < 1000:
                colours.add((r, g, b))
    return hits, len(colours)
