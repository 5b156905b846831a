# attack: recursion without a bound, past CPython's recursion limit
# expect: out_of_memory
# limits: {"timeout_ms": 60000}
# must not: grow the stack past the memory limit or into other mappings
import sys

sys.setrecursionlimit(1 << 30)


def down(n):
    return down(n + 1) + 1


down(0)
