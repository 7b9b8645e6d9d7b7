#!/usr/bin/env bash
# Builds sysscope's release artifacts on this x86_64 Debian machine, per architecture, into dist/:
#
#   scripts/build-release.sh            amd64 (the default)
#   scripts/build-release.sh arm64      aarch64, cross-built
#   scripts/build-release.sh all        both, plus the multi-architecture image index
#
# For each architecture ARCH (amd64, arm64) and VERSION (Cargo.toml):
#   sysscope-VERSION-linux-ARCH.tar.gz   the binary (probes embedded), the default config with
#                                        every key documented, the systemd unit, bash/zsh/fish
#                                        completions, the man page, LICENSE and README.md
#   sysscope_VERSION-1_ARCH.deb          the same installed under /usr, /etc (a conffile) and
#   sysscope-VERSION-1.RPMARCH.rpm       the unit (RPMARCH: x86_64, aarch64); built with nFPM
#                                        (packaging/nfpm.yaml)
#   sysscope_VERSION_linux_ARCH.oci.tar  the container image (packaging/oci/Containerfile) as an
#                                        OCI archive, built with buildah: no registry, no daemon
# and, with `all`, sysscope_VERSION_linux_multiarch.oci.tar: one OCI index naming both images
# (`skopeo copy --all oci-archive:FILE docker://REGISTRY/sysscope:VERSION` publishes it).
# SHA256SUMS lists every file. Each run starts from an empty dist/.
#
# The binary needs glibc 2.28 or later (RHEL 8, Ubuntu 20.04, Debian 11, Amazon Linux 2023) and
# stays dynamically linked so that it can load the host's NVML: it is linked by zig
# (cargo-zigbuild) against glibc 2.28's symbol versions, and the build fails if it needs a
# newer GLIBC_ symbol version than that. Its revision is this checkout's commit, with "-dirty"
# when the tree has uncommitted changes (SYSSCOPE_REVISION overrides).
#
# Environment: SYSSCOPE_DIST (default dist), SYSSCOPE_RELEASE_IMAGE=0 skips the image,
# SYSSCOPE_RELEASE_PROFILE (default release; the test suite's check uses release-ci, the same
# build without optimisation: see Cargo.toml),
# SOURCE_DATE_EPOCH fixes the build date (default: when the build script last ran) and the
# archives' timestamps (default: the commit's time).
# Installs what is missing first, idempotently (scripts/setup.sh --release).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
arches=()
case "${1:-amd64}" in
  amd64 | x86_64) arches=(amd64) ;;
  arm64 | aarch64) arches=(arm64) ;;
  all) arches=(amd64 arm64) ;;
  *)
    echo "build-release.sh: unknown architecture '$1' (expected amd64, arm64 or all)" >&2
    exit 2
    ;;
esac
log() { printf '[release] %s\n' "$*" >&2; }

setup_args=(--release)
[[ " ${arches[*]} " == *" arm64 "* ]] && setup_args+=(--release-arm64)
scripts/setup.sh "${setup_args[@]}"
export PATH="$HOME/.cargo/bin:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"

profile=${SYSSCOPE_RELEASE_PROFILE:-release}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
if [ -z "${SYSSCOPE_REVISION:-}" ]; then
  SYSSCOPE_REVISION=$(git rev-parse --verify HEAD)
  git diff --quiet HEAD -- 2>/dev/null || SYSSCOPE_REVISION="$SYSSCOPE_REVISION-dirty"
fi
export SYSSCOPE_REVISION
# Not exported when unset: a new date on every run would rebuild (and relink) the binary.
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
dist=${SYSSCOPE_DIST:-$top/dist}
mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
find "$dist" -maxdepth 1 -type f -delete
stage_root="$dist/.stage"
# buildah's own storage, apart from the machine's (vfs: no overlay or fuse needed).
oci_store=(--root "$top/target/oci/storage" --runroot "$top/target/oci/run" --storage-driver vfs)

# The newest GLIBC_ symbol version an ELF file needs (readelf reads any architecture).
glibc_needed() {
  readelf --version-info --wide "$1" | grep -o 'Name: GLIBC_[0-9.]*' | sed 's/.*GLIBC_//' |
    sort -t . -k 1,1n -k 2,2n -k 3,3n | tail -n 1
}

# Runs the binary of ARCH on this machine: natively, or under qemu's user-mode emulation with
# the arm64 glibc Debian's cross toolchain ships.
run_bin() {
  local arch=$1
  shift
  case "$arch" in
    amd64) "$@" ;;
    arm64) qemu-aarch64 -L /usr/aarch64-linux-gnu "$@" ;;
  esac
}

build_arch() {
  local arch=$1 triple gnu_dir interp
  case "$arch" in
    amd64) triple=x86_64-unknown-linux-gnu gnu_dir=/lib/x86_64-linux-gnu interp=/lib64/ld-linux-x86-64.so.2 ;;
    arm64) triple=aarch64-unknown-linux-gnu gnu_dir=/usr/aarch64-linux-gnu/lib interp=/lib/ld-linux-aarch64.so.1 ;;
  esac
  log "$arch: cargo zigbuild --profile $profile ($triple, glibc 2.28)"
  local started=$SECONDS
  # The probes are built inside for the target's syscall ABI (aya-build follows the target).
  cargo zigbuild --profile "$profile" --locked -p sysscope --bin sysscope --target "$triple.2.28"
  log "$arch: built in $((SECONDS - started)) s"
  local stage="$stage_root/$arch"
  rm -rf "$stage"
  mkdir -p "$stage/completions"
  # Debug info is for developers (line tables); the symbol table stays for backtraces.
  /usr/lib/llvm-22/bin/llvm-strip --strip-debug -o "$stage/sysscope" \
    "${CARGO_TARGET_DIR:-target}/$triple/$profile/sysscope"

  local needed
  needed=$(glibc_needed "$stage/sysscope")
  if [ -z "$needed" ] || [ "$(printf '%s\n2.28\n' "$needed" | sort -t . -k 1,1n -k 2,2n | tail -n 1)" != 2.28 ]; then
    log "$arch: the binary needs GLIBC_$needed, newer than the 2.28 the release promises"
    exit 1
  fi
  log "$arch: newest glibc symbol version needed: GLIBC_$needed (at most 2.28)"

  # Generated from the binary itself, so they match its flags and config types.
  local bin=("$stage/sysscope")
  run_bin "$arch" "${bin[@]}" --version | grep -qx "revision:   $SYSSCOPE_REVISION" || {
    log "$arch: the binary does not report revision $SYSSCOPE_REVISION:"
    run_bin "$arch" "${bin[@]}" --version >&2
    exit 1
  }
  run_bin "$arch" "${bin[@]}" --print-default-config >"$stage/config.toml"
  run_bin "$arch" "${bin[@]}" completions bash >"$stage/completions/sysscope.bash"
  run_bin "$arch" "${bin[@]}" completions zsh >"$stage/completions/_sysscope"
  run_bin "$arch" "${bin[@]}" completions fish >"$stage/completions/sysscope.fish"
  run_bin "$arch" "${bin[@]}" man | gzip -9n >"$stage/sysscope.1.gz"
  created=$(run_bin "$arch" "${bin[@]}" --version | sed -n 's/^build date: //p')
  cp packaging/systemd/sysscope.service "$stage/"
  cp LICENSE-APACHE "$stage/LICENSE"
  cp README.md "$stage/README.md"

  # The tarball: one directory, root-owned, entries sorted, timestamps of the commit.
  local name="sysscope-$version-linux-$arch"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    --transform "s,^\.,$name," -C "$stage" \
    --exclude=./oci --exclude=./nfpm.yaml -cf - . | gzip -9n >"$dist/$name.tar.gz"

  # nFPM expands variables in a few fields only, not in the contents' paths: fill them in here.
  sed -e "s|\${ARCH}|$arch|g" -e "s|\${VERSION}|$version|g" -e "s|\${STAGE}|$stage|g" \
    packaging/nfpm.yaml >"$stage/nfpm.yaml"
  for packager in deb rpm; do
    nfpm package --config "$stage/nfpm.yaml" --packager "$packager" --target "$dist/" >/dev/null
  done

  if [ "${SYSSCOPE_RELEASE_IMAGE:-1}" != 0 ]; then
    build_image "$arch" "$stage" "$gnu_dir" "$interp"
  fi
}

# The image's root: the binary, the libraries it needs (resolved in the target's glibc, which
# is Debian's: newer than 2.28, as the binary allows), the dynamic loader, and CA certificates
# for OTLP over TLS.
build_image() {
  local arch=$1 stage=$2 gnu_dir=$3 interp=$4
  local rootfs="$stage/oci/rootfs"
  mkdir -p "$rootfs/usr/bin" "$rootfs/etc/ssl/certs"
  cp "$stage/sysscope" "$rootfs/usr/bin/sysscope"
  local queue=("$stage/sysscope") seen=" " lib
  while [ ${#queue[@]} -gt 0 ]; do
    local file=${queue[0]}
    queue=("${queue[@]:1}")
    for lib in $(readelf --dynamic --wide "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      [[ "$seen" == *" $lib "* ]] && continue
      seen+="$lib "
      [ -e "$gnu_dir/$lib" ] || { log "$arch: $lib not found in $gnu_dir"; exit 1; }
      mkdir -p "$rootfs$gnu_dir"
      cp -L "$gnu_dir/$lib" "$rootfs$gnu_dir/$lib"
      queue+=("$gnu_dir/$lib")
    done
  done
  mkdir -p "$rootfs$(dirname "$interp")"
  cp -L "$gnu_dir/$(basename "$interp")" "$rootfs$interp"
  cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  find "$rootfs" -exec touch -h -d "@$epoch" {} +

  local tag="localhost/sysscope:$version-$arch"
  buildah "${oci_store[@]}" rmi -f "$tag" >/dev/null 2>&1 || true
  buildah "${oci_store[@]}" bud --quiet --platform "linux/$arch" --timestamp "$epoch" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$SYSSCOPE_REVISION" \
    --build-arg "CREATED=$created" \
    -f packaging/oci/Containerfile -t "$tag" "$stage/oci" >/dev/null
  local archive="$dist/sysscope_${version}_linux_$arch.oci.tar"
  rm -f "$archive"
  buildah "${oci_store[@]}" push --quiet "$tag" "oci-archive:$archive:sysscope:$version" >/dev/null
  log "$arch: image $tag -> $(basename "$archive")"
}

created=""
for arch in "${arches[@]}"; do
  build_arch "$arch"
done

if [ ${#arches[@]} -eq 2 ] && [ "${SYSSCOPE_RELEASE_IMAGE:-1}" != 0 ]; then
  index="localhost/sysscope:$version"
  buildah "${oci_store[@]}" manifest rm "$index" >/dev/null 2>&1 || true
  buildah "${oci_store[@]}" manifest create "$index" >/dev/null
  for arch in "${arches[@]}"; do
    buildah "${oci_store[@]}" manifest add --arch "$arch" --os linux "$index" \
      "containers-storage:localhost/sysscope:$version-$arch" >/dev/null
  done
  archive="$dist/sysscope_${version}_linux_multiarch.oci.tar"
  rm -f "$archive"
  buildah "${oci_store[@]}" manifest push --quiet --all "$index" \
    "oci-archive:$archive:sysscope:$version" >/dev/null
  log "multi-architecture index -> $(basename "$archive")"
fi

(cd "$dist" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort |
  xargs sha256sum >SHA256SUMS)
log "artifacts in $dist:"
(cd "$dist" && ls -l --time-style=+ $(cut -d ' ' -f 3 SHA256SUMS) SHA256SUMS) >&2
