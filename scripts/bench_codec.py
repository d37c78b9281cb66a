"""Encode/decode rate of an 8-GPU NodeGpuSample: fastavro, the generated Python codec and the C
decoder (when built), in one run.

.venv/bin/python scripts/bench_codec.py [--records 3000] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import time

import fastavro

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import default_scenario
from peerwatch.schemas.codec import HEADER_LEN, AvroCodec
from peerwatch.schemas.compiled import compile_decoder
from peerwatch.schemas.native import native_decoder
from peerwatch.schemas.registry import current_schema, raw_schema, strip_logical_types


def rate(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for _ in range(n):
        fn()
    return n / (time.process_time() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    fleet = Fleet(default_scenario(nodes=8, duration_s=10))
    record = [r.value for t in fleet.ticks() for r in t if r.stream == "samples"][-1]
    codec = AvroCodec("NodeGpuSample")
    schema = current_schema("NodeGpuSample")
    message = codec.encode(record)
    body = message[HEADER_LEN:]
    buf = io.BytesIO()
    wire = strip_logical_types(raw_schema("NodeGpuSample"))
    py_decode = compile_decoder(wire)
    native_decode = native_decoder(wire)

    def fa_encode() -> None:
        buf.seek(0)
        buf.truncate()
        fastavro.schemaless_writer(buf, schema, record)

    out = {
        "record_bytes": len(message),
        "fastavro_encode_per_s": rate(fa_encode, args.records),
        "compiled_encode_per_s": rate(lambda: codec.encode(record), args.records),
        "fastavro_decode_per_s": rate(
            lambda: fastavro.schemaless_reader(io.BytesIO(body), schema, None), args.records
        ),
        "compiled_decode_per_s": rate(lambda: py_decode(message, HEADER_LEN), args.records),
    }
    if native_decode is not None:
        out["native_decode_per_s"] = rate(lambda: native_decode(message, HEADER_LEN), args.records)
        out["codec_decode_per_s"] = rate(lambda: codec.decode(message), args.records)
    out["encode_speedup"] = out["compiled_encode_per_s"] / out["fastavro_encode_per_s"]
    out["decode_speedup"] = out["compiled_decode_per_s"] / out["fastavro_decode_per_s"]
    if native_decode is not None:
        out["native_decode_speedup"] = out["native_decode_per_s"] / out["fastavro_decode_per_s"]
    if args.json:
        print(json.dumps({k: round(v, 2) for k, v in out.items()}))
        return
    for key, value in out.items():
        print(f"{key:24} {value:>12,.1f}")


if __name__ == "__main__":
    main()
