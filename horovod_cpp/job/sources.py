"""Where the user's function came from, carried with it to the ranks.

cloudpickle 3.1 and later pickles a function defined in ``__main__`` (a notebook cell, a
script, a test module) by value with its code's file name replaced by ``<dynamic-code>``, so a
rank's traceback says ``File "<dynamic-code>", line 65, in main`` with no source line. The
driver records, for every code object it can reach from the function (nested functions, the
functions of its closure and the module-level functions it names, recursively), the real file
name, and the lines of those files; the rank puts the file names back into the code objects and
primes ``linecache`` with the lines where the file does not exist on its host. Tracebacks, stack
dumps and warnings on the ranks then name the user's file and line, as with older cloudpickle.
"""
import functools
import linecache
import os
import types

_DYNAMIC = "<dynamic-code>"
_MAX_SOURCE_BYTES = 4 << 20  # source text carried along, at most (4 MiB)


def _functions(fn):
    """The plain functions reachable from ``fn``: itself, its closure's and the module-level
    functions its code names, recursively."""
    seen, stack = {}, [fn]
    while stack:
        f = stack.pop()
        if isinstance(f, functools.partial):  # runner.run and spark.run bind args this way
            stack += [f.func, *f.args, *f.keywords.values()]
            continue
        if isinstance(f, types.MethodType):
            f = f.__func__
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen[id(f)] = f
        for cell in f.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        for code in _codes(f.__code__):
            for name in code.co_names:
                stack.append(f.__globals__.get(name))
    return list(seen.values())


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def record(fn):
    """On the driver: {(name, first line): file name} of every code object reachable from
    ``fn``, and {file name: its lines}."""
    files, lines, size = {}, {}, 0
    for f in _functions(fn):
        for code in _codes(f.__code__):
            if code.co_filename.startswith("<"):
                continue
            files[(code.co_name, code.co_firstlineno)] = code.co_filename
            if code.co_filename not in lines:
                text = linecache.getlines(code.co_filename)
                size += sum(len(line) for line in text)
                lines[code.co_filename] = text if size <= _MAX_SOURCE_BYTES else []
    return {"files": files, "lines": lines}


def _restore(code, files):
    consts = tuple(_restore(c, files) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    filename = code.co_filename
    if filename == _DYNAMIC:
        filename = files.get((code.co_name, code.co_firstlineno), filename)
    return code.replace(co_filename=filename, co_consts=consts)


def restore(fn, recorded):
    """On a rank: the recorded file names back into the code of ``fn`` and of the functions it
    reaches, and their lines into ``linecache`` where the files are not on this host."""
    if not recorded:
        return
    files = recorded["files"]
    for f in _functions(fn):
        if any(code.co_filename == _DYNAMIC for code in _codes(f.__code__)):
            f.__code__ = _restore(f.__code__, files)
    for filename, text in recorded["lines"].items():
        if text and not os.path.exists(filename):
            # mtime None: linecache.checkcache keeps the entry (as for a __loader__'s source).
            linecache.cache[filename] = (sum(len(line) for line in text), None, text, filename)
