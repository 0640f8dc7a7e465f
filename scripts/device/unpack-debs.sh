# Sourced by the GPU scripts: unpacks the Debian packages brought along in .debs/
# (scripts/device/fetch-debs.sh) into .deps/ and points the build and the loader at them.
# Sets prefix_args (extra CMake configure arguments; empty when there are no .debs).
prefix_args=()
if compgen -G ".debs/*.deb" >/dev/null; then
  rm -rf .deps && mkdir -p .deps/root
  for deb in .debs/*.deb; do dpkg -x "$deb" .deps/root; done
  prefix_args=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
  export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
# xgrammar (structured output), built from the source distribution fetch-debs.sh brought along,
# unless .xgrammar/install came along already built (scripts/deps/xgrammar.sh keeps it then).
if compgen -G ".debs/xgrammar-*.tar.gz" >/dev/null; then
  bash scripts/deps/xgrammar.sh --sdist "$(compgen -G ".debs/xgrammar-*.tar.gz" | head -n 1)"
fi
