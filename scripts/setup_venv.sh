#!/usr/bin/env bash
# The Python environments the tests and benchmarks use, each with horovod_cpp installed.
#   setup_venv.sh           .venv: Debian's /usr/bin/python3 with --system-site-packages (Debian's
#                           torch 1.13, numpy, pytest, mpi4py, cloudpickle), horovod_cpp by
#                           pip install --no-index --no-build-isolation . (nothing is downloaded)
#   setup_venv.sh --spark   also pyspark (HorovodRunner) and ray (horovod_cpp.ray) from PyPI
#   setup_venv.sh --pypi    .venv-pypi: the PyPI lane, a venv WITHOUT system site packages with
#                           the packages pinned in scripts/pypi-lane.txt (the newest torch, its
#                           CUDA wheel ~3 GB, pyspark, ...), horovod_cpp by a plain `pip install .`
#                           (PEP 517 build isolation, as a user installs it)
#   setup_venv.sh --tf      .venv-tf: the TensorFlow lane, a venv WITHOUT system site packages with
#                           TensorFlow 2 and Keras 3 pinned in scripts/tf-lane.txt; it also sees
#                           the PyPI lane's shared venv, after its own (torch for Keras's torch
#                           backend, pyspark for HorovodRunner); horovod_cpp by `pip install .`
#   setup_venv.sh --docs    .venv-docs: Sphinx and MyST (scripts/docs-requirements.txt) beside
#                           Debian's torch, for scripts/build_docs.sh (horovod_cpp is read from
#                           the checkout, its compiled core mocked: nothing is built)
# The packages from PyPI are installed once per machine and set of pins, into a shared venv
# under $HVD_VENV_CACHE (default ~/.cache/horovod_cpp: debian-<key>, pypi-<key>, the key a hash
# of the pins and the Python), not once per checkout: a clean clone (CI's) then sets up in
# ~100 s (the builds of horovod_cpp's module) instead of ~216 s of downloading and unpacking
# ~3.5 GB and the builds. The checkout's venv is a venv of its own (its python, pip,
# horovod_cpp and console scripts) whose site-packages has a .pth file that adds the shared
# venv's site-packages after its own (so horovod_cpp and anything installed into the
# checkout's venv come first). Old pins' shared venvs stay until removed
# (rm -rf ~/.cache/horovod_cpp; the next run installs again).
# CMake rebuilds only what changed (build-python/, one tree per environment).
# First it installs the Debian packages that every lane builds on (scripts/install_deps.sh, with
# --spark a Java runtime too; one dpkg query when they are there): without them the Debian lane's
# offline pip install fails on its first missing package (cloudpickle) and no lane compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  ""|--pypi|--tf|--docs) scripts/install_deps.sh ;;
  --spark) scripts/install_deps.sh --spark ;;
  *) echo "usage: scripts/setup_venv.sh [--spark | --pypi | --tf | --docs]" >&2; exit 2 ;;
esac
PYSPARK_VERSION=4.0.5   # Debian lane; tested with Java 17; any pyspark >= 3.5 works
RAY_VERSION=2.60.0      # Debian lane: horovod_cpp.ray's tests (a local cluster and the test bed)
CACHE=${HVD_VENV_CACHE:-${XDG_CACHE_HOME:-~/.cache}/horovod_cpp}
pip=(--quiet --disable-pip-version-check)

die() { echo "setup_venv: $*" >&2; exit 1; }

check_import() {  # check_import PYTHON [MODULE]: from outside the checkout, so the installed
  local module=${2:-horovod_cpp.torch}  # package is the one imported
  (cd / && "$OLDPWD/$1" -c "import $module") || die "$module does not import in $1"
}

site_packages() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }

new_venv() {  # new_venv DIR SYSTEM_SITE: a venv of /usr/bin/python3, with Debian's packages if 1
  /usr/bin/python3 -m venv $([[ $2 == 1 ]] && echo --system-site-packages) "$1"
}

# shared_venv LANE SYSTEM_SITE REQUIREMENTS_FILE WHAT: prints the shared venv of these pins,
# made first if it is not there (complete: a venv interrupted half-way is made again). Two
# checkouts setting up at once take turns (flock).
shared_venv() {
  local lane=$1 system=$2 reqs=$3 what=$4 key base
  key=$({ /usr/bin/python3 -VV; echo "$lane $system"; grep -v '^#' "$reqs"; } | sha256sum | cut -c1-12)
  base=$CACHE/$lane-$key
  mkdir -p "$CACHE"
  exec {lock}> "$CACHE/.lock-$lane-$key"
  flock "$lock"
  if [[ ! -f $base/.complete ]]; then
    echo "setup_venv: installing $what from PyPI into $base (once per machine and set of pins)" >&2
    rm -rf "$base"
    new_venv "$base" "$system"
    { "$base/bin/python" -m pip install "${pip[@]}" --upgrade pip &&
        "$base/bin/python" -m pip install "${pip[@]}" -r "$reqs"; } >&2 ||
      die "could not install $what from PyPI (network, proxy or certificates?)"
    cp "$reqs" "$base/.complete"
  fi
  exec {lock}>&-
  echo "$base"
}

# own_venv DIR SYSTEM_SITE [SHARED...]: DIR as a venv of its own (made again if it is not one of
# this layout, e.g. a full venv from before the shared ones) that sees the SHARED venvs'
# packages, the first one's first.
own_venv() {
  local dir=$1 system=$2 shared sp f name
  if [[ -x $dir/bin/python && ! -f $dir/.hvd-layout ]]; then
    echo "setup_venv: $dir is a venv of the old layout (every package inside it): made again" >&2
    rm -rf "$dir"
  fi
  if [[ ! -x $dir/bin/python ]]; then
    new_venv "$dir" "$system"
    echo "packages from PyPI: the shared venv named in site-packages/_hvd_shared.pth" \
      > "$dir/.hvd-layout"
  fi
  shift 2
  [[ $# -gt 0 ]] || return 0
  sp=$(site_packages "$dir")
  rm -f "$sp/_hvd_shared.pth"
  for shared in "$@"; do
    # site.addsitedir, not a bare path: the shared site-packages' own .pth files are read too.
    echo "import site; site.addsitedir('$(site_packages "$shared")')" >> "$sp/_hvd_shared.pth"
    # The shared venv's console scripts (ray, pytest, ...), run by this venv's python, and its
    # other programs (pyspark's spark-submit, ...) linked.
    for f in "$shared"/bin/*; do
      name=$(basename "$f")
      [[ -f $f && -x $f && ! -e $dir/bin/$name && $name != activate* ]] || continue
      if head -1 "$f" | grep -q "^#!$shared/bin/python"; then
        { echo "#!$PWD/$dir/bin/python"; tail -n +2 "$f"; } > "$dir/bin/$name"
        chmod +x "$dir/bin/$name"
      else
        ln -s "$f" "$dir/bin/$name"
      fi
    done
  done
}

if [[ "${1:-}" == "--pypi" ]]; then
  venv=.venv-pypi
  shared=$(shared_venv pypi 0 scripts/pypi-lane.txt \
    "scripts/pypi-lane.txt (torch's CUDA wheel and its NVIDIA libraries: ~3 GB, a few minutes)")
  own_venv "$venv" 0 "$shared"
  "$venv/bin/python" -m pip install "${pip[@]}" .
  check_import "$venv/bin/python"
  exit 0
fi

if [[ "${1:-}" == "--tf" ]]; then
  venv=.venv-tf
  shared=$(shared_venv tf 0 scripts/tf-lane.txt \
    "scripts/tf-lane.txt (TensorFlow's CPU wheel and Keras: ~700 MB, a minute or two)")
  pypi_shared=$(shared_venv pypi 0 scripts/pypi-lane.txt \
    "scripts/pypi-lane.txt (torch's CUDA wheel and its NVIDIA libraries: ~3 GB, a few minutes)")
  own_venv "$venv" 0 "$shared" "$pypi_shared"
  "$venv/bin/python" -m pip install "${pip[@]}" .
  check_import "$venv/bin/python" "horovod_cpp.tensorflow, horovod_cpp.keras"
  exit 0
fi

if [[ "${1:-}" == "--docs" ]]; then
  shared=$(shared_venv docs 1 scripts/docs-requirements.txt "Sphinx and MyST (~30 MB)")
  own_venv .venv-docs 1 "$shared"
  .venv-docs/bin/python -c "import sphinx, myst_parser" ||
    die "Sphinx and MyST do not import in .venv-docs"
  exit 0
fi

py=.venv/bin/python
if [[ "${1:-}" == "--spark" ]]; then
  reqs=$(mktemp)
  trap 'rm -f "$reqs"' EXIT
  printf 'pyspark==%s\nray==%s\n' "$PYSPARK_VERSION" "$RAY_VERSION" > "$reqs"
  shared=$(shared_venv debian 1 "$reqs" "pyspark==$PYSPARK_VERSION and ray==$RAY_VERSION (~500 MB)")
  own_venv .venv 1 "$shared"
else
  own_venv .venv 1
fi
"$py" -m pip install "${pip[@]}" --no-index --no-build-isolation .
check_import "$py"
if [[ "${1:-}" == "--spark" ]]; then
  "$py" -c "import pyspark, ray, sys; sys.exit(
    (pyspark.__version__, ray.__version__) != ('$PYSPARK_VERSION', '$RAY_VERSION'))" ||
    die "pyspark $PYSPARK_VERSION and ray $RAY_VERSION do not import in $py"
fi
