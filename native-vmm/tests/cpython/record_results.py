# Runs CPython's regression-test driver (`python -m test` arguments in sys.argv) and reports every
# test's outcome on fd 2 as a line "@@sandfork STATUS TEST_ID" (STATUS: pass, fail, error, skip),
# so that a run in the VM and a native run can be compared test by test (native-vmm/tests/common/
# cpython.rs). The hooks sit on unittest's base TestResult, which regrtest's result class extends.
import os
import unittest.result as _result


def _report(status, test_id):
    os.write(2, ("\n@@sandfork %s %s\n" % (status, test_id)).encode())


def _hook(status, original):
    def hook(self, test, *rest):
        _report(status, test.id())
        return original(self, test, *rest)
    return hook


for _status, _name in (("pass", "addSuccess"), ("pass", "addExpectedFailure"), ("fail", "addFailure"),
                       ("error", "addError"), ("skip", "addSkip"), ("fail", "addUnexpectedSuccess")):
    setattr(_result.TestResult, _name, _hook(_status, getattr(_result.TestResult, _name)))

_add_subtest = _result.TestResult.addSubTest


def _subtest(self, test, subtest, err):
    # A failed subtest fails its test (unittest then never calls addSuccess for it).
    if err is not None:
        _report("fail", test.id())
    return _add_subtest(self, test, subtest, err)


_result.TestResult.addSubTest = _subtest

from test.libregrtest import main  # noqa: E402

main()
