#!/usr/bin/env python3
"""Compares two runs of the node e2e suite spec by spec from ginkgo's JUnit reports (the
target/node-e2e-<column>-junit/ dirs the e2e tests keep): each run's summed spec time and the
specs that took longest more in the second run than in the first.

Usage: hack/e2e-times.py FIRST_JUNIT_DIR SECOND_JUNIT_DIR [N]
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET


def spec_times(junit_dir):
    """{spec name: seconds} of the specs that ran (skipped ones left out)."""
    times = {}
    for path in sorted(glob.glob(os.path.join(junit_dir, "junit_*.xml"))):
        for case in ET.parse(path).getroot().iter("testcase"):
            if case.find("skipped") is not None:
                continue
            times[case.get("name", "")] = float(case.get("time", "0") or 0)
    return times


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip())
    first, second = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    a, b = spec_times(first), spec_times(second)
    print(f"{first}: {len(a)} specs, {sum(a.values()):.0f} s of spec time")
    print(f"{second}: {len(b)} specs, {sum(b.values()):.0f} s of spec time")
    both = [(b[k] - a[k], a[k], b[k], k) for k in a.keys() & b.keys()]
    both.sort(reverse=True)
    print(f"specs slower in the second run (first s, second s, difference):")
    for diff, ta, tb, name in both[:n]:
        print(f"  {ta:7.1f} {tb:7.1f} {diff:+7.1f}  {name}")


if __name__ == "__main__":
    main()
