"""Compare a benchmark's new results file with the committed one, target by target: old value, new
value and their ratio. Prints a table; `.ci/gpu-check` runs it after each benchmark.

    python benchmarks/_compare.py benchmarks/results/memory_pool-nvidia-h100-80gb-hbm3.json OUT/memory_pool.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _cells(doc: dict) -> dict[tuple, dict]:
    # Results documents: schema 1 labels a row by "config_label" (falling back to "config"), schema 2 by "config".
    return {(r["model"], r.get("config_label", r["config"]), r["batch_size"], r["mode"]): r for r in doc["rows"]}


def compare_results(old: dict, new: dict) -> int:
    """Two Results documents (gpuopt bench / benchmark() output): throughput per common cell."""
    before, after = _cells(old), _cells(new)
    ratios = []
    for key, r in after.items():
        o = before.get(key)
        if o is None or o["status"] != "ok" or r["status"] != "ok":
            print(f"  {' '.join(map(str, key))}: {'not in the committed run' if o is None else 'failed in one run'}")
            continue
        ratio = r["throughput_items_per_s"] / o["throughput_items_per_s"]
        ratios.append(ratio)
        print(f"  {' '.join(map(str, key))}: committed {o['throughput_items_per_s']:,.0f}/s, now "
              f"{r['throughput_items_per_s']:,.0f}/s -> {ratio:.3f}x")
    if ratios:
        ratios.sort()
        print(f"COMPARE gpuopt bench: {len(ratios)} cells, throughput now/committed median "
              f"{ratios[len(ratios) // 2]:.3f}x, range {ratios[0]:.3f}x .. {ratios[-1]:.3f}x")
    return 0


def main(old_path: str, new_path: str) -> int:
    old, new = (json.loads(Path(p).read_text()) for p in (old_path, new_path))
    if "rows" in old and "rows" in new:
        return compare_results(old, new)
    before = {t["name"]: t for t in old.get("targets", [])}
    print(f"{new['benchmark']}: {new.get('device')} @ {new.get('git_commit')} against the committed "
          f"{old.get('device')} @ {old.get('git_commit')}")
    ratios = []
    for t in new.get("targets", []):
        o = before.get(t["name"])
        if o is None or not o.get("value"):
            print(f"  {t['name']}: new {t['value']:.4g} (no committed value)")
            continue
        ratio = t["value"] / o["value"]
        ratios.append(ratio)
        print(f"  {t['name']}: committed {o['value']:.4g}, now {t['value']:.4g} -> {ratio:.3f}x"
              f" [{'PASS' if t.get('passed') else 'N/A' if t.get('passed') is None else 'FAIL'}]")
    gone = sorted(set(before) - {t["name"] for t in new.get("targets", [])})
    if gone:
        print(f"  no longer measured: {', '.join(gone)}")
    if ratios:
        ratios.sort()
        print(f"COMPARE {new['benchmark']}: {len(ratios)} targets, now/committed median "
              f"{ratios[len(ratios) // 2]:.3f}x, range {ratios[0]:.3f}x .. {ratios[-1]:.3f}x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/_compare.py COMMITTED.json NEW.json")
    sys.exit(main(sys.argv[1], sys.argv[2]))
