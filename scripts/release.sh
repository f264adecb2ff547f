#!/usr/bin/env bash
# Build mqd's release binaries: static (CGO_ENABLED=0) for linux and darwin on
# amd64 and arm64, the version and commit stamped in with -ldflags -X (so
# `mqd --version` names them whatever GOFLAGS says, -buildvcs=false included),
# and their SHA-256 checksums, into dist/ (git-ignored).
#
#   scripts/release.sh [VERSION]     # e.g. v0.2.0; default: the tag on HEAD, else git describe
#
# Environment:
#   MQD_RELEASE_TARGETS  space-separated GOOS/GOARCH pairs (default: the four above)
#   MQD_RELEASE_DIST     output directory (default: ./dist)
#
# Output: dist/mqd-VERSION-GOOS-GOARCH (one binary per target) and
# dist/SHA256SUMS (`sha256sum -c SHA256SUMS` checks them). A dirty work tree is
# refused for a version that looks like a release (vX.Y.Z): a release names a
# commit, and the binaries must be what that commit builds.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=${MQD_RELEASE_TARGETS:-"linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"}
dist=${MQD_RELEASE_DIST:-dist}

commit=$(git rev-parse HEAD)
dirty=""
if ! git diff --quiet HEAD -- 2>/dev/null; then
  dirty="+dirty"
fi
version=${1:-}
if [ -z "$version" ]; then
  version=$(git describe --tags --exact-match --match 'v*' 2>/dev/null \
    || git describe --tags --match 'v*' --dirty 2>/dev/null \
    || echo "v0.0.0-dev-$(git rev-parse --short=12 HEAD)$dirty")
fi
case "$version" in
v[0-9]*.[0-9]*.[0-9]*) ;;
*) echo "release.sh: version $version is not vMAJOR.MINOR.PATCH[-...]" >&2; exit 2 ;;
esac
if [ -n "$dirty" ] && [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "release.sh: uncommitted changes; a release ($version) is built from a clean commit" >&2
  exit 1
fi
# The commit's time, not the build's: two builds of one commit are the same bytes.
date=$(git show -s --format=%cI HEAD)

ldflags="-s -w -X main.version=$version -X main.commit=$commit$dirty -X main.date=$date"
mkdir -p "$dist"
built=()
for t in $targets; do
  goos=${t%/*}
  goarch=${t#*/}
  out="mqd-$version-$goos-$goarch"
  echo "building $out"
  CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch go build -trimpath -ldflags "$ldflags" -o "$dist/$out" ./cmd/mqd
  built+=("$out")
done
(
  cd "$dist"
  sha256sum "${built[@]}" >SHA256SUMS
  cat SHA256SUMS
)
echo "release $version ($commit$dirty) in $dist/"
