"""Tiny check counter for the Python system tests (tests/system/py_*.py).

Each check is counted; a failure prints why and the run goes on, so one
summary line `name: checks=N passed=M` tells the whole story.
"""

import sys
import time


class Checks:
    def __init__(self, name):
        self.name = name
        self.total = 0
        self.passed = 0
        self.start = time.time()

    def check(self, cond, what):
        self.total += 1
        if cond:
            self.passed += 1
        else:
            print("FAIL: %s" % what, flush=True)
        return bool(cond)

    def raises(self, exc, fn, what):
        """fn() must raise exc (a clear error, not a crash or a silent pass)."""
        try:
            fn()
        except exc as e:
            return self.check(True, what + " (%s)" % e)
        except Exception as e:  # the wrong error counts as a failure
            return self.check(False, "%s: raised %s: %s" % (what, type(e).__name__, e))
        return self.check(False, what + ": no error raised")

    def finish(self, **extra):
        fields = " ".join("%s=%s" % kv for kv in extra.items())
        print("%s: checks=%d passed=%d%s%s (%.1fs)" % (
            self.name, self.total, self.passed, " " if fields else "", fields,
            time.time() - self.start), flush=True)
        sys.exit(0 if self.total and self.passed == self.total else 1)
