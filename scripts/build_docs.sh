#!/usr/bin/env bash
# Builds the docs site (docs/: one page per topic, and the API reference generated from the
# docstrings of horovod_cpp.torch, .spark, .ray, the runner and from the C++ headers) into
# build-docs/html, with warnings as errors: a broken link (in a page or in the README), a page
# missing from the table of contents, a docstring that documents a parameter its signature
# does not have, or a module that no longer imports fails it. ./test.sh runs it.
#   scripts/build_docs.sh            then open build-docs/html/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_venv.sh --docs
rm -rf build-docs   # whole: no page left over from an earlier build, every warning again
.venv-docs/bin/python -m sphinx -W --keep-going -q -b html -d build-docs/doctrees docs \
  build-docs/html
echo "build_docs: build-docs/html/index.html"
