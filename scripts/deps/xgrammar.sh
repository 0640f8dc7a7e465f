#!/usr/bin/env bash
# Builds xgrammar's C++ core (the grammar engine behind structured output, docs/server.md) from its
# PyPI source distribution into a prefix, once: a prefix that already holds this version's library
# is kept, so CI pays the build (about a minute on 2 idle cores) only when the version changes.
#   scripts/deps/xgrammar.sh [--prefix DIR] [--sdist FILE]
#     --prefix  where include/, lib/libxgrammar.a and VERSION go (default .xgrammar/install,
#               git-ignored: CMake's default DEEPFUSE_XGRAMMAR_ROOT)
#     --sdist   the source distribution, already downloaded (the GPU machines have no network:
#               scripts/device/fetch-debs.sh brings it in .debs/); without it, it is downloaded
#               from PyPI into .xgrammar/ and checked against its sha256.
#     --url     prints the source distribution's URL and exits.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=0.2.9
sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
url=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-$version.tar.gz
prefix=.xgrammar/install
sdist=""
while (($#)); do
  case $1 in
  --prefix) prefix=${2:?--prefix needs a folder}; shift 2 ;;
  --sdist) sdist=${2:?--sdist needs a file}; shift 2 ;;
  --url) echo "$url"; exit 0 ;;
  *) echo "xgrammar.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ -f $prefix/lib/libxgrammar.a && -f $prefix/include/xgrammar/xgrammar.h && -f $prefix/VERSION &&
      $(cat "$prefix/VERSION") == "$version" ]]; then
  echo "xgrammar: $version present in $prefix"
  exit 0
fi
if [[ -z $sdist ]]; then
  sdist=.xgrammar/xgrammar-$version.tar.gz
  if [[ ! -f $sdist ]] || ! echo "$sha256  $sdist" | sha256sum --check --status; then
    mkdir -p .xgrammar
    echo "xgrammar: downloading the $version source distribution from PyPI"
    curl -sSfL --retry 3 -o "$sdist.partial" "$url"
    mv "$sdist.partial" "$sdist"
  fi
fi
echo "$sha256  $sdist" | sha256sum --check --status ||
  { echo "xgrammar: $sdist is not xgrammar $version's source distribution (sha256 differs)" >&2; exit 1; }
start=$(date +%s)
# Built in a fixed folder of the tree, so a compiler cache (ccache, used when present) recognises
# the sources from one worktree or run to the next.
work=.xgrammar/build
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$work/xgrammar-$version
mkdir -p "$src/build"
# Its cmake/config.cmake turns the Python bindings on (they need tvm_ffi); a config.cmake in the
# build folder wins. -fno-lto after its -flto=auto: LTO objects would make every program linking
# the library pay link-time code generation; -Wno-error: its -Werror is for its own CI's compilers.
cat >"$src/build/config.cmake" <<'CFG'
set(CMAKE_BUILD_TYPE Release)
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
CFG
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$src/build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$PWD/$work/install" >"$work/cmake.log" ||
  { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$src/build" --parallel "$(nproc)" >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; exit 1; }
cmake --install "$src/build" >/dev/null
echo "$version" >"$work/install/VERSION"
rm -rf "$prefix"
mkdir -p "$(dirname "$prefix")"
mv "$work/install" "$prefix"
echo "xgrammar: built $version into $prefix in $(( $(date +%s) - start )) s"
