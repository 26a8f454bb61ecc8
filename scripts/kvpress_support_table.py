"""Write docs/methods/kvpress-support.md: kvbench's support claims against NVIDIA/kvpress 0.5.5, computed by replaying
every claimed recording of tests/fixtures/reference/{kvpress,learned,kvzip}/ (issue #54 item 6, issue #58).

    PYTHONPATH=$PWD python scripts/kvpress_support_table.py           # replay every claim, rewrite the page
    PYTHONPATH=$PWD python scripts/kvpress_support_table.py --check   # exit 1 if the page is not what it would write

The claims and the replays are the parity tests' own (tests/parity/kvpress_claims.py); the page's format and its
reader are tests/parity/kvpress_support_page.py; a press replayed otherwise (merged values, thresholds, learned
weights, KVzip-style replays) is replayed by its own parity test's replay function (``Claim.replay``).  A recording
added later is listed at once among the unclaimed ones; a Claim line makes it counted rows.  About a minute on one
CPU thread (the decoding claims run the recorded tiny Llama step by step; KVzap and KVgrad the real SmolLM2-135M).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path.cwd()  # the checkout (run from its root: PYTHONPATH=. python scripts/kvpress_support_table.py)
sys.path.insert(0, str(ROOT))  # the tests' parity claims (tests/parity/kvpress_claims.py) are read from the checkout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the page instead of writing it")
    args = parser.parse_args(argv)
    import torch

    from tests.parity.kvpress_claims import CLAIMS, tally
    from tests.parity.kvpress_support_page import PAGE, all_row_keys, render

    torch.set_num_threads(1)
    by_key = {(claim.recording, claim.spelling): claim for claim in CLAIMS}
    tallies = {}
    for key in all_row_keys():
        recording, spelling, form, dtype = key
        tallies[key] = tally(by_key[recording, spelling], form, dtype)
        print(f"{recording} {form} {dtype}: {tallies[key]}", flush=True)
    text = render(tallies)
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
        if current != text:
            print(f"{PAGE} is stale: rerun scripts/kvpress_support_table.py", file=sys.stderr)
            return 1
        print(f"{PAGE} is current")
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE} ({len(tallies)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
