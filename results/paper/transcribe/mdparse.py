"""One-off helper: pull markdown tables out of the spec files (not part of the repo)."""
import re
from pathlib import Path

SPECS = Path(__file__).resolve().parents[4] / "shared" / "specs"  # ../shared/specs beside the checkout


def tables_after(fname, marker, n=1, start_line=None):
    lines = (SPECS / fname).read_text().splitlines()
    idx = None
    for i, line in enumerate(lines):
        if marker in line and (start_line is None or i >= start_line):
            idx = i
            break
    assert idx is not None, marker
    out = []
    i = idx + 1
    while len(out) < n and i < len(lines):
        if lines[i].startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in block]
            header, body = rows[0], [r for r in rows[2:]]
            out.append((header, body, idx + 1))
        else:
            i += 1
    return out


def partial_cells(fname, table_marker):
    """Return {budget: {column_label: 'values'}} from '- B=128 partial cells ...' lines after marker."""
    lines = (SPECS / fname).read_text().splitlines()
    idx = next(i for i, line in enumerate(lines) if table_marker in line)
    res = {}
    for line in lines[idx:]:
        m = re.match(r"- B=(\d+) partial cells .*? — (.*)$", line)
        if m:
            b = m.group(1)
            cells = {}
            for part in m.group(2).split("; "):
                k, v = part.split(": ", 1)
                cells[k.strip()] = v.strip()
            res[b] = cells
        elif res and line.startswith("####"):
            break
        elif res and not line.startswith("- B=") and line.strip() == "" and len(res) >= 5:
            break
    return res
