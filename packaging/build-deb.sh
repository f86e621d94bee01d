#!/usr/bin/env bash
# Build the Debian package target/deb/agent-run_<version>_<arch>.deb from the
# static binaries in target/static/ (built first by build-static.sh when they
# are missing), with dpkg-deb alone: no debhelper, no cargo-deb, no fakeroot.
#
#   bash packaging/build-deb.sh
#   sudo dpkg -i target/deb/agent-run_*.deb
#
# Options, for the tests under a real systemd (tests/src/systemd.rs), which
# package the debug binaries the suite already built instead of a release build:
#   --bin-dir DIR   take agent-run, agent-run-watchdog and agent-run-gen (man
#                   pages, completions) from DIR; never build anything. The
#                   binaries are stripped of debug info (strip, from binutils)
#                   and the package is gzip-compressed, to keep it quick.
#   --out DIR       write the .deb into DIR instead of target/deb.
# The unit files and docs are the same in both forms.
#
# Contents:
#   /usr/bin/agent-run, /usr/bin/agent-run-watchdog
#   /usr/lib/systemd/user/agent-run-watchdog.service
#   /usr/lib/systemd/system/agent-run-watchdog@.service
#   /usr/share/doc/agent-run/{README.md,contract.md,usage.md,agents.md,operations.md,copyright,
#   changelog.Debian.gz}
#   man pages and shell completions (agent-run-gen)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'agent-run: build-deb: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

umask 022

# The version is the workspace's ([workspace.package] version in Cargo.toml).
version=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml | sed -n 1p)
[[ -n $version ]] || die "no [workspace.package] version in Cargo.toml"
# A semver pre-release (1.2.0-rc.1) must sort before its release in Debian: 1.2.0~rc.1.
debversion=${version//-/\~}

changelog_version=$(sed -n '1s/^agent-run (\([^)]*\)).*/\1/p' packaging/debian/changelog)
[[ $changelog_version == "$debversion" ]] \
    || die "packaging/debian/changelog starts at '$changelog_version' but Cargo.toml says '$version' (Debian: '$debversion'): add a changelog entry"

arch=$(dpkg --print-architecture)

static=target/static
bin_dir=
out=target/deb
while (($#)); do
    case $1 in
        --bin-dir) [[ $# -ge 2 ]] || die "--bin-dir needs a directory"; bin_dir=$2; shift 2 ;;
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out=$2; shift 2 ;;
        *) die "unknown argument '$1' (--bin-dir DIR, --out DIR)" ;;
    esac
done
if [[ -n $bin_dir ]]; then
    for b in agent-run agent-run-watchdog agent-run-gen; do
        [[ -x $bin_dir/$b ]] || die "no $bin_dir/$b: build it first (cargo build --workspace --bins)"
    done
    bins=$bin_dir
    # Man pages and completions go beside the stage, never into the binaries' dir.
    gen_dir="$out/gen"
    compress=(-Zgzip -z1)
else
    if [[ ! -x $static/agent-run || ! -x $static/agent-run-watchdog ]]; then
        say "no static binaries in $static: running packaging/build-static.sh"
        bash packaging/build-static.sh
    fi
    bins=$static
    gen_dir=$static
    compress=()
fi
built_version=$("$bins/agent-run" --version)
[[ $built_version == "agent-run $version" ]] \
    || die "$bins/agent-run --version says '$built_version', expected 'agent-run $version': rebuild it"

mkdir -p "$out"
rm -f "$out"/agent-run_*.deb
stage="$out/stage/agent-run_${debversion}_$arch"
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"

install -D -m 0755 "$bins/agent-run" "$stage/usr/bin/agent-run"
install -D -m 0755 "$bins/agent-run-watchdog" "$stage/usr/bin/agent-run-watchdog"
if [[ -n $bin_dir ]]; then
    # Debug builds carry ~30 MiB of debug info each: a package of them is slow to build and
    # to install, and nothing reads it there.
    strip --strip-debug "$stage/usr/bin/agent-run" "$stage/usr/bin/agent-run-watchdog"
fi
install -D -m 0644 packaging/systemd/agent-run-watchdog.service \
    "$stage/usr/lib/systemd/user/agent-run-watchdog.service"
install -D -m 0644 packaging/systemd/agent-run-watchdog@.service \
    "$stage/usr/lib/systemd/system/agent-run-watchdog@.service"

doc="$stage/usr/share/doc/agent-run"
install -D -m 0644 README.md "$doc/README.md"
# The external contract is the repository's own (docs/contract.md); a package without it is
# not a package of this project.
[[ -f docs/contract.md ]] || { echo "agent-run: build-deb: docs/contract.md is missing" >&2; exit 1; }
install -m 0644 docs/contract.md "$doc/contract.md"
# The reference the README sends its readers to.
for page in usage agents operations; do install -m 0644 "docs/$page.md" "$doc/$page.md"; done
install -m 0644 packaging/debian/copyright "$doc/copyright"
gzip -9n <packaging/debian/changelog >"$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"

# Man pages and completions, generated from the same clap definitions the binaries parse with.
if [[ -n $bin_dir ]]; then
    rm -rf "$gen_dir"
    "$bin_dir/agent-run-gen" "$gen_dir" >/dev/null
else
    cargo run --quiet --locked -p agent-run-gen -- "$gen_dir"
fi

# --- man pages and shell completions -------------------------------------
# Generated from the clap definitions by packaging/gen (agent-run-gen OUT_DIR)
# into $gen_dir (target/static, or $out/gen with --bin-dir): man pages in
# $gen_dir/man, flat or in man1/ and man8/ (the section is the file's
# extension: agent-run.1, agent-run-start.1, ..., agent-run-watchdog.8),
# completions in $gen_dir/completions under clap_complete's names
# (agent-run.bash, _agent-run for zsh, agent-run.fish). Nothing to do while
# those directories don't exist.
if [[ -d $gen_dir/man ]]; then
    while IFS= read -r -d '' page; do
        name=${page##*/}
        section=${name##*.}
        install -D -m 0644 "$page" "$stage/usr/share/man/man$section/$name"
        gzip -9nf "$stage/usr/share/man/man$section/$name"
    done < <(find "$gen_dir/man" -type f -name '*.[1-8]' -print0 | sort -z)
fi
if [[ -d $gen_dir/completions ]]; then
    shopt -s nullglob
    for f in "$gen_dir"/completions/*; do
        name=${f##*/}
        case $name in
            *.bash) install -D -m 0644 "$f" "$stage/usr/share/bash-completion/completions/${name%.bash}" ;;
            _*.ps1 | *.elv) ;; # no Debian location for PowerShell or Elvish completions
            _*) install -D -m 0644 "$f" "$stage/usr/share/zsh/vendor-completions/$name" ;;
            *.fish) install -D -m 0644 "$f" "$stage/usr/share/fish/vendor_completions.d/$name" ;;
            *) say "ignoring completion file of unknown shell: $f" ;;
        esac
    done
    shopt -u nullglob
fi
# --- end of hook ------------------------------------------------------------

for script in postinst prerm postrm; do
    install -m 0755 "packaging/debian/$script" "$stage/DEBIAN/$script"
done

installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$debversion/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_size/" \
    packaging/debian/control >"$stage/DEBIAN/control"
if grep -q '@[A-Z_]*@' "$stage/DEBIAN/control"; then
    die "unfilled placeholder in DEBIAN/control: $(grep '@[A-Z_]*@' "$stage/DEBIAN/control")"
fi
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"

deb="$out/agent-run_${debversion}_$arch.deb"
dpkg-deb --root-owner-group "${compress[@]}" --build "$stage" "$deb" >/dev/null
rm -rf "$out/stage"
[[ -z $bin_dir ]] || rm -rf "$gen_dir"

dpkg-deb --info "$deb" >&2
dpkg-deb --contents "$deb" >&2
say "built $deb ($(stat -c %s "$deb") bytes)"
