#!/usr/bin/env bash
# Builds ferry's Debian package: target/debian/ferry_<version>_<arch>.deb.
#
#   ./scripts/deb.sh                      # cargo build --release, then package
#   ./scripts/deb.sh --binary PATH        # package an existing binary instead
#   ./scripts/deb.sh --out DIR            # write the .deb in DIR
#   ./scripts/deb.sh --compress none      # dpkg-deb -Z: xz (default), gzip, zstd, none
#
# Then: sudo apt install ./target/debian/ferry_*.deb
#
# Made with dpkg-deb, not cargo-deb: dpkg-deb is on every Debian machine,
# so packaging needs no extra tool and nothing from the network, and the
# tree it packs is spelled out here. What goes in:
#   /usr/bin/ferry                       the binary, stripped (0755)
#   /lib/systemd/system/ferry.service    systemd/ferry.service with /usr/bin/ferry
#                                        for the source install's /usr/local/bin/ferry
#   /etc/ferry/ferry.toml                conf/ferry.toml with data_dir = "/var/lib/ferry"
#                                        (root:root 0640; a conffile, so upgrades
#                                        keep local edits; postinst gives it group ferry)
#   /usr/share/doc/ferry/                README.md, CHANGELOG.md, docs/, copyright,
#                                        changelog.gz (a one-entry Debian changelog)
#   /usr/share/lintian/overrides/ferry   packaging/lintian-overrides
#   DEBIAN/postinst, prerm, postrm       from packaging/ (user, store dir, service)
# Depends comes from dpkg-shlibdeps (libc6, libgcc-s1), plus passwd for
# the postinst's useradd. `lintian` on the result says only no-manual-page
# (two deliberate findings are overridden, with why, in
# packaging/lintian-overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tree is packed with the modes it has: not a restrictive umask's.
umask 022

binary=""
out=""
compress="xz"
while [ $# -gt 0 ]; do
    case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --compress) compress="${2:?--compress needs xz, gzip, zstd or none}"; shift 2 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "deb.sh: unknown argument $1 (try --help)" >&2; exit 64 ;;
    esac
done
case "$compress" in
xz | gzip | zstd | none) ;;
*) echo "deb.sh: --compress $compress: use xz, gzip, zstd or none" >&2; exit 64 ;;
esac
for tool in dpkg-deb dpkg-shlibdeps strip; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "deb.sh: $tool not found: sudo apt-get install dpkg-dev binutils" >&2
        exit 1
    }
done

# Where cargo puts its output (CARGO_TARGET_DIR or a config may move it).
target_dir() {
    cargo metadata --locked --format-version 1 --no-deps |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'
}
if [ -z "$binary" ]; then
    cargo build --locked --release --bin ferry
    binary="$(target_dir)/release/ferry"
fi
[ -x "$binary" ] || { echo "deb.sh: $binary is not an executable" >&2; exit 1; }
[ -n "$out" ] || out="$(target_dir)/debian"

version=$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
[ -n "$version" ] || { echo "deb.sh: no version in Cargo.toml's [package]" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# dpkg-shlibdeps wants the tree as debian/<package>/ beside a debian/control.
pkg="$work/debian/ferry"
mkdir -p "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/etc/ferry" \
    "$pkg/usr/share/doc/ferry"
printf 'Source: ferry\n\nPackage: ferry\nArchitecture: any\n' >"$work/debian/control"

# The binary stripped as Debian's dh_strip does (the release profile keeps
# line tables for perf: profile target/release/ferry, not the packaged one).
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
    -o "$pkg/usr/bin/ferry" "$binary"
chmod 0755 "$pkg/usr/bin/ferry"

# The unit, as systemd/ferry.service but for the packaged binary's path.
grep -q '^ExecStart=/usr/local/bin/ferry ' systemd/ferry.service ||
    { echo "deb.sh: systemd/ferry.service: no ExecStart=/usr/local/bin/ferry" >&2; exit 1; }
sed 's|/usr/local/bin/ferry|/usr/bin/ferry|g' systemd/ferry.service >"$pkg/lib/systemd/system/ferry.service"
chmod 0644 "$pkg/lib/systemd/system/ferry.service"

# The config: the documented defaults (loopback listeners) with the store
# where the unit's StateDirectory is, so the CLI and the service agree.
grep -q '^data_dir = "./data"$' conf/ferry.toml ||
    { echo "deb.sh: conf/ferry.toml: no data_dir = \"./data\" line to replace" >&2; exit 1; }
sed 's|^data_dir = "./data"$|data_dir = "/var/lib/ferry"|' conf/ferry.toml >"$pkg/etc/ferry/ferry.toml"
chmod 0640 "$pkg/etc/ferry/ferry.toml"
echo /etc/ferry/ferry.toml >"$pkg/DEBIAN/conffiles"

# Docs, with docs/ kept as a folder so README's links still work.
doc="$pkg/usr/share/doc/ferry"
cp README.md CHANGELOG.md "$doc/"
cp -r docs "$doc/docs"
cp packaging/copyright "$doc/copyright"
# A package without a Debian source tree still needs a Debian changelog
# (changelog.gz): one entry, pointing at CHANGELOG.md, dated as the commit.
when=$(git log -1 --format=%ct 2>/dev/null || date +%s)
gzip -9n >"$doc/changelog.gz" <<EOF
ferry ($version) unstable; urgency=medium

  * Built by scripts/deb.sh from the ferry source tree; the changes are in
    /usr/share/doc/ferry/CHANGELOG.md.

 -- ferry developers <dev@ferry.invalid>  $(LC_ALL=C date -u -R -d "@$when")
EOF
mkdir -p "$pkg/usr/share/lintian/overrides"
install -m0644 packaging/lintian-overrides "$pkg/usr/share/lintian/overrides/ferry"
find "$doc" -type d -exec chmod 0755 {} + && find "$doc" -type f -exec chmod 0644 {} +

for script in postinst prerm postrm; do
    install -m0755 "packaging/$script" "$pkg/DEBIAN/$script"
done

depends=$(cd "$work" && dpkg-shlibdeps -O -e debian/ferry/usr/bin/ferry 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "deb.sh: dpkg-shlibdeps found no dependencies for $binary" >&2; exit 1; }
installed_size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<EOF
Package: ferry
Version: $version
Architecture: $arch
Maintainer: ferry developers <dev@ferry.invalid>
Installed-Size: $installed_size
Depends: $depends, passwd
Section: net
Priority: optional
Description: MQTT edge gateway: durable store-and-forward
 ferry sits between a factory's field devices and an enterprise backend.
 Devices talk MQTT to it (its embedded broker, or the site's Mosquitto);
 every uplink is committed to a local SQLite store before the device is
 told "stored", then forwarded to the backend over an upstream MQTT broker
 with retries, receipts and dead letters, and downlinks wait for devices
 that are offline.
 .
 The package runs it as the systemd service ferry.service (user ferry,
 store in /var/lib/ferry); edit /etc/ferry/ferry.toml, then
 systemctl enable --now ferry.
EOF
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/ferry_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$pkg" "$deb" >/dev/null
echo "$deb"
