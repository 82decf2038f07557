"""Lesson 01's DRAM accounting of the three copies, derived from the committed Nsight Compute data.

    ./course run site/data/evidence/01-memory-bandwidth/dram_traffic.py      # writes dram_traffic.json beside it

Reads site/data/profile/01-memory-bandwidth.json (`./course profile 01 --impl solutions --json` on a GPU) and the
cases' byte counts in site/data/bench/01-memory-bandwidth.json, and writes one row per copy kernel: the bytes DRAM
read and wrote (ncu's dram__bytes_read.sum / dram__bytes_write.sum) as multiples of the bytes the copy must move each
way, its time and DRAM rate against the coalesced copy's, and the shares of its two top warp stalls. Nothing here
runs a kernel: it is the arithmetic the lesson's sentences quote, kept as data so it cannot drift from the profile.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
PROFILE = ROOT / "site" / "data" / "profile" / "01-memory-bandwidth.json"
BENCH = ROOT / "site" / "data" / "bench" / "01-memory-bandwidth.json"
OUT = Path(__file__).resolve().with_suffix(".json")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    profile = json.loads(PROFILE.read_text())
    bytes_of = {case["name"]: case["bytes"] for case in json.loads(BENCH.read_text())["cases"]}
    kernels = {k["kernel"]: k for k in profile["kernels"]}
    coalesced = kernels["copy_coalesced_kernel"]
    rows = []
    for name, k in kernels.items():
        each_way = bytes_of[k["case"]] / 2  # a copy reads n floats and writes n floats
        read, write = k["metrics"]["dram__bytes_read.sum"], k["metrics"]["dram__bytes_write.sum"]
        stalls = {s["reason"]: s["share_pct"] for s in k["top_stalls"]}
        rows.append({
            "name": name, "case": k["case"], "copied_gb_each_way": each_way / 1e9,
            "dram_read_gb": read / 1e9, "dram_write_gb": write / 1e9,
            "read_x": read / each_way, "write_x": write / each_way, "traffic_x": (read + write) / (2 * each_way),
            "time_us": k["time_us"], "time_x_coalesced": k["time_us"] / coalesced["time_us"],
            "dram_pct": k["dram_pct"], "dram_rate_x_coalesced": k["dram_gbps"] / coalesced["dram_gbps"],
            "stall_long_scoreboard_pct": stalls.get("long scoreboard"),
            "stall_lg_throttle_pct": stalls.get("lg throttle"),
        })
    data = {"gpu": profile["gpu"], "date": profile["date"],
            "command": "python3 site/data/evidence/01-memory-bandwidth/dram_traffic.py",
            "source": f"derived from site/data/profile/01-memory-bandwidth.json ({profile['command']}, ncu "
                      f"{profile['ncu']}, clocks: {profile['clock_control']}) and the byte counts of "
                      "site/data/bench/01-memory-bandwidth.json",
            "rows": rows,
            "table": {"columns": [["name", "kernel", ""], ["read_x", "DRAM reads / bytes read", ".1f"],
                                  ["write_x", "DRAM writes / bytes written", ".1f"],
                                  ["dram_pct", "DRAM % of peak", ".1f"],
                                  ["time_x_coalesced", "time / coalesced copy's", ".1f"]]}}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    for r in rows:
        print(f"{r['name']:<24} reads {r['read_x']:5.2f}x writes {r['write_x']:5.2f}x traffic {r['traffic_x']:5.2f}x "
              f"time {r['time_x_coalesced']:5.2f}x rate {r['dram_rate_x_coalesced']:.2f}x")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
