#!/usr/bin/env bash
# The standard package: `python -m build` (PEP 517, isolated) makes an sdist and a wheel from
# this checkout, the wheel (built from the sdist) installs into a new venv without system site
# packages, and there its _core imports and hvdrun --version prints the one version string.
#   check_package.sh PYTHON SOURCE_DIR      (PYTHON has the `build` package: the PyPI lane's)
set -euo pipefail
python=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy of the tracked files: the build must need nothing that only a working tree has.
mkdir "$work/src"
(cd "$src" && git ls-files -z | xargs -0 cp --parents -t "$work/src")
# (The sources sit in a new temporary directory each time; ccache, where the build uses it,
# hashes paths relative to them: CMakeLists.txt's launcher.)
"$python" -m build --outdir "$work/dist" "$work/src" > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; echo "check_package: python -m build failed" >&2; exit 1; }
sdist=$(ls "$work"/dist/horovod_cpp-*.tar.gz) wheel=$(ls "$work"/dist/horovod_cpp-*.whl)
listing=$(tar tzf "$sdist")
for f in CMakeLists.txt pyproject.toml setup.py packaging/backend.py common/horovod.h \
         bindings/python/core_module.cc; do
  grep -q "^horovod_cpp-[0-9.]*/$f$" <<< "$listing" ||
    { echo "check_package: $f is not in $sdist" >&2; exit 1; }
done
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$wheel"
version=$(cd / && "$work/venv/bin/python" -c "import horovod_cpp._core, horovod_cpp; print(horovod_cpp.__version__)")
[[ $("$work/venv/bin/hvdrun" --version) == "hvdrun (horovod_cpp) $version" ]] ||
  { echo "check_package: hvdrun --version does not print $version" >&2; exit 1; }
echo "check_package: $(basename "$sdist") and $(basename "$wheel") built; the wheel installs into a new venv (version $version)"
