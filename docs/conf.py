"""Sphinx configuration of horovod_cpp's docs site: scripts/build_docs.sh builds it with
warnings as errors (./test.sh does too), into build-docs/html."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)                                   # the package, from the checkout
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

project = "horovod_cpp"
with open(os.path.join(ROOT, "horovod_cpp", "_build.py")) as f:   # the one version string
    release = version = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)
extensions = ["myst_parser", "sphinx.ext.autodoc", "hvd_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "reference"]
root_doc = "index"
myst_heading_anchors = 3
# The compiled core is not needed to document the Python API: its calls happen at run time.
autodoc_mock_imports = ["horovod_cpp._core"]
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_member_order = "bysource"
html_theme = "alabaster"
html_title = "horovod_cpp %s" % release
suppress_warnings = []
