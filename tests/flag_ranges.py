"""Reads a trainer's --help on stdin and prints, for every numeric flag with a range (", in [lo, hi]" or
", >= lo"), the values just outside it, one "FLAG VALUE RANGE" line each, RANGE as the error message writes
it. tests/test_cli.sh runs each and expects the refusal.  ./train_llama_ref --help | python3 tests/flag_ranges.py"""
import re
import sys

INT_MAX = 2**31 - 1


def fmt(x):
    return str(int(x)) if float(x).is_integer() else repr(x)


for line in sys.stdin:
    m = re.match(r"^  (--[a-z0-9-]+|-[A-Z]) N .*?, (in ([\[(])([-0-9.e+]+), ([-0-9.e+]+)([\])])|>= ([-0-9.e+]+))", line)
    if not m:
        continue
    flag = m.group(1)
    if m.group(7) is not None:  # an int with no bound but int's
        lo, hi, lo_open, hi_open = float(m.group(7)), float(INT_MAX), False, False
    else:
        lo, hi = float(m.group(4)), float(m.group(5))
        lo_open, hi_open = m.group(3) == "(", m.group(6) == ")"
    shown = f"{'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if hi_open else ']'}"
    print(flag, fmt(lo) if lo_open else fmt(lo - 1), shown)
    print(flag, fmt(hi) if hi_open else fmt(hi + 1), shown)
