"""A script file with its arguments as what a job runs, as ``TorchDistributor.run("train.py",
"--lr", "0.1")`` does: ``HorovodRunner.run`` and ``horovod_cpp.spark.run`` take a path where
they take a function.

The driver reads the file; each rank runs its text as ``__main__``, with ``sys.argv`` the path
and the arguments and the script's directory first on ``sys.path``, in the rank's own process
(so ``hvd.init()`` in it joins the job). The file need not exist where the ranks run; modules it
imports from its directory must. ``sys.exit(0)`` (or the end of the file) is success, another
exit status an error that names it; the job's value is None, as with TorchDistributor.
"""
import linecache
import os
import sys


class ScriptMain(object):
    """Callable that runs a script's text as ``__main__`` (pickled with the job)."""

    def __init__(self, path, args=()):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError("a script is given by its path, got %r" % (path,))
        path = os.path.abspath(os.fspath(path))
        try:
            with open(path) as f:
                self.source = f.read()
        except OSError as e:
            raise FileNotFoundError("cannot read the script %s: %s" % (path, e.strerror)) from e
        self.path = path
        self.args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
        compile(self.source, path, "exec")  # a syntax error shows on the driver, not N times

    def __repr__(self):
        return "script %s %s" % (self.path, " ".join(self.args))

    def __call__(self):
        code = compile(self.source, self.path, "exec")
        if not os.path.exists(self.path):  # tracebacks show the lines anyway
            lines = self.source.splitlines(True)
            linecache.cache[self.path] = (len(self.source), None, lines, self.path)
        saved_argv = sys.argv
        sys.argv = [self.path] + self.args
        sys.path.insert(0, os.path.dirname(self.path))
        try:
            exec(code, {"__name__": "__main__", "__file__": self.path,
                        "__builtins__": __builtins__})
        except SystemExit as e:
            if e.code not in (None, 0):
                raise RuntimeError("%s %s exited with status %r"
                                   % (self.path, " ".join(self.args), e.code)) from None
        finally:
            sys.argv = saved_argv
            try:
                sys.path.remove(os.path.dirname(self.path))
            except ValueError:
                pass
        return None


def as_main(main, args, caller):
    """``main`` itself, or a ScriptMain when it is a path (then with ``args``)."""
    if isinstance(main, (str, os.PathLike)):
        return ScriptMain(main, args)
    if args:
        raise TypeError("%s: positional arguments are the script's command line; a function "
                        "takes keyword arguments" % caller)
    return main
