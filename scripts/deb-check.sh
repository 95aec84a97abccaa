#!/usr/bin/env bash
# Builds the Debian package and checks what it would install: unpacked with `dpkg-deb -x` into a
# temporary folder (nothing is installed on this machine), the packaged `slotgate` must accept the
# packaged /etc/slotgate/slotgate.toml (`slotgate check`), and the package must carry its systemd
# unit, its sysusers.d file and the configuration as a conffile.
#
# Installs cargo-deb (pinned) when it is missing or another version. Run it from anywhere:
# `./scripts/deb-check.sh`. It prints the path of the .deb last. The release build is most of its
# time (docs/operations.md, "Install from the Debian package", has the figures).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_DEB_VERSION=3.8.0
if [ "$(cargo deb --version 2>/dev/null || true)" != "cargo-deb $CARGO_DEB_VERSION" ]; then
  cargo install --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi

# cargo-deb prints the package's path as its last line.
deb=$(cargo deb -p slotgate-gateway --locked | tail -n 1)
[ -f "$deb" ] || { echo "deb-check: cargo deb made no package (got: $deb)" >&2; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
control="$root/DEBIAN"
mkdir -p "$control"
dpkg-deb -x "$deb" "$root"
dpkg-deb -e "$deb" "$control"

fail() { echo "deb-check: $*" >&2; exit 1; }
for file in usr/bin/slotgate etc/slotgate/slotgate.toml; do
  [ -f "$root/$file" ] || fail "the package has no /$file"
done
unit=$root/usr/lib/systemd/system/slotgate.service
[ -f "$unit" ] || fail "the package has no systemd unit /usr/lib/systemd/system/slotgate.service"
[ -f "$root/usr/lib/sysusers.d/slotgate.conf" ] \
  || fail "the package has no sysusers.d file for the slotgate user"
grep -q '^u slotgate ' "$root/usr/lib/sysusers.d/slotgate.conf" \
  || fail "the sysusers.d file does not make the slotgate user"
for script in preinst postinst prerm postrm; do
  [ ! -f "$control/$script" ] || sh -n "$control/$script" || fail "$script is not valid sh"
done
# cargo-deb put its generated steps in place of the token, once.
[ "$(grep -c 'systemd-sysusers' "$control/postinst")" -eq 1 ] \
  || fail "the postinst does not create the slotgate user exactly once"
grep -qx '/etc/slotgate/slotgate.toml' "$control/conffiles" \
  || fail "/etc/slotgate/slotgate.toml is not a conffile"
grep -q '^ExecStart=slotgate serve .*--config /etc/slotgate/slotgate.toml' "$unit" \
  || fail "the unit does not start slotgate on /etc/slotgate/slotgate.toml"
# The example is meant to be read: most of it is comments.
comments=$(grep -c '^ *#' "$root/etc/slotgate/slotgate.toml")
[ "$comments" -ge 20 ] || fail "the packaged configuration has only $comments comment lines"

# The packaged binary on the packaged configuration (it reaches no engine: the example has no
# `parallel = "auto"`); bounded, though it only reads a file.
timeout 60 "$root/usr/bin/slotgate" check --config "$root/etc/slotgate/slotgate.toml" >/dev/null \
  || fail "the packaged slotgate refuses the packaged configuration"
"$root/usr/bin/slotgate" --version

echo "deb-check: ok"
echo "$deb"
