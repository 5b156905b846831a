# Runs CPython's regression-test driver (`python -m test` arguments in sys.argv) and reports every
# test's outcome on fd 2 as a line "@@sandfork STATUS TEST_ID" (STATUS: pass, fail, error, skip;
# a failure or error adds " | " and the exception's last line, a skip its reason),
# so that a run in the VM and a native run can be compared test by test (native-vmm/tests/common/
# cpython.rs). The hooks sit on unittest's base TestResult, which regrtest's result class extends.
import os
import unittest.result as _result


def _report(status, test_id, detail=None):
    line = "%s %s" % (status, test_id)
    if detail is not None:
        reason = detail if isinstance(detail, str) else "%s: %s" % (detail[0].__name__, detail[1])
        line += " | " + " ".join(reason.split())[:300]
    os.write(2, ("\n@@sandfork %s\n" % line).encode(errors="replace"))


def _hook(status, original):
    def hook(self, test, *rest):
        _report(status, test.id(), rest[0] if rest and isinstance(rest[0], (str, tuple)) else None)
        return original(self, test, *rest)
    return hook


for _status, _name in (("pass", "addSuccess"), ("pass", "addExpectedFailure"), ("fail", "addFailure"),
                       ("error", "addError"), ("skip", "addSkip"), ("fail", "addUnexpectedSuccess")):
    setattr(_result.TestResult, _name, _hook(_status, getattr(_result.TestResult, _name)))

_add_subtest = _result.TestResult.addSubTest


def _subtest(self, test, subtest, err):
    # A failed subtest fails its test (unittest then never calls addSuccess for it).
    if err is not None:
        _report("fail", test.id(), err)
    return _add_subtest(self, test, subtest, err)


_result.TestResult.addSubTest = _subtest

from test.libregrtest import main  # noqa: E402

main()
