#!/usr/bin/env bash
# Run HERE (a Debian machine with apt), before a GPU run: downloads into .debs/ (git-ignored) the
# Debian packages the build needs that a bare GPU machine may lack. scripts/device/gpu.sh unpacks them
# into a private prefix there; nothing is installed system-wide and nothing is committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .debs
cd .debs
packages=(nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0
          libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libcpp-httplib-dev
          libcpp-httplib0.11 libbrotli1 libbrotli-dev)
apt-get download "${packages[@]}" 2>&1 | tail -n 2
# xgrammar's source distribution from PyPI (Debian has no package; unpack-debs.sh builds it there).
url=$(bash ../scripts/deps/xgrammar.sh --url)
[ -f "$(basename "$url")" ] || curl -sSfL --retry 3 -o "$(basename "$url")" "$url"
ls -1 *.deb | wc -l | xargs echo "debs in .debs/:"
