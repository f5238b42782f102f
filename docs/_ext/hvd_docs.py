"""Sphinx extension for horovod_cpp's docs: the checks that make a stale page fail the build
(warnings are errors: scripts/build_docs.sh runs sphinx with -W), and the generated C++ pages.

* Links: MyST warns about a link to a page or a file that does not exist (a file of the
  repository outside docs/, such as ``../examples/train.cpp``, is copied as a download). The
  README's relative links are checked here (the README is the map over these pages, not a page
  of the site).
* Docstrings: a parameter a docstring documents (``:param name:``, or a line that starts with
  ````name``:``) must be a parameter of the signature, or the build fails.
* ``.. cpp-header:: common/horovod.h``: the header's declarations with their comments, in order.
"""
import inspect
import os
import re

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx.util import logging

logger = logging.getLogger(__name__)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")
PARAM = re.compile(r"^\s*(?::param\s+(?:[\w\[\], ]+\s+)?(\w+):|``(\w+)``\s*:)")


def check_readme(app):
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        text = f.read()
    for number, line in enumerate(text.split("\n"), 1):
        for match in LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            if not os.path.exists(os.path.join(ROOT, target)):
                logger.warning("README.md:%d: link to %s, which does not exist", number, target)


def check_docstring(app, what, name, obj, options, lines):
    if what not in ("function", "method", "class"):
        return
    target = obj.__init__ if what == "class" else obj
    try:
        signature = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    params = set(signature)
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in signature.values())
    for line in lines:
        match = PARAM.match(line)
        if not match:
            continue
        documented = match.group(1) or match.group(2)
        if documented not in params and not accepts_any:
            logger.warning("%s: the docstring documents parameter %r, which its signature "
                           "%s does not have" % (name, documented, sorted(params)))


class CppHeader(Directive):
    """The declarations of one C++ header with their comments, in the header's order."""
    required_arguments = 1
    option_spec = {"title": directives.unchanged}

    def run(self):
        path = os.path.join(ROOT, self.arguments[0])
        self.state.document.settings.record_dependencies.add(path)
        with open(path) as f:
            text = f.read()
        body = text.split("namespace hvd {", 1)
        head, rest = (body[0], body[1]) if len(body) == 2 else ("", text)
        section = nodes.section(ids=[nodes.make_id(self.arguments[0])])
        section += nodes.title(text=self.options.get("title", self.arguments[0]))
        intro = [line[2:].strip() for line in head.split("\n") if line.startswith("//")]
        section += nodes.literal_block("\n".join(intro), "\n".join(intro))
        for chunk in re.split(r"\n\s*\n", rest):
            lines = chunk.strip("\n").split("\n")
            comment = [ln.strip()[2:].strip() for ln in lines if ln.strip().startswith("//")]
            code = [ln for ln in lines if not ln.strip().startswith("//")]
            code = [ln for ln in code if ln.strip() and not ln.startswith("}  // namespace")]
            if comment:
                section += nodes.paragraph(text=" ".join(comment))
            if code:
                section += nodes.literal_block("\n".join(code), "\n".join(code),
                                               language="cpp")
        return [section]


def setup(app):
    app.connect("builder-inited", check_readme)
    app.connect("autodoc-process-docstring", check_docstring)
    app.add_directive("cpp-header", CppHeader)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
