#!/usr/bin/env bash
# make vm-check: the static checks of the VM tooling, offline and in seconds.
#   1. `vagrant validate` on the Vagrantfile. With the vagrant-libvirt plugin
#      installed (scripts/provision.sh installs it from Debian) plain validate
#      also checks the libvirt block (cpu topology, NUMA nodes adding up to
#      the vCPUs); without a provider plugin it is `vagrant validate -p`,
#      which ignores provider blocks. Neither downloads the box.
#   2. `shellcheck -S warning` on every shell script in the checkout: *.sh,
#      and any file whose first line is a sh/bash/dash shebang.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

die() {
    printf 'vm-check: error: %s\n' "$*" >&2
    exit 1
}

command -v shellcheck >/dev/null || die "shellcheck is missing: run scripts/provision.sh (make setup)"
# provision.sh installs vagrant from Debian, and on Ubuntu only where its
# archive packages it; there, say plainly that validate did not run.
VAGRANT=yes
if ! command -v vagrant >/dev/null; then
    grep -qx 'ID=debian' /etc/os-release 2>/dev/null && die "vagrant is missing: run scripts/provision.sh (make setup)"
    printf 'vm-check: vagrant is not installed here (not packaged for this system): vagrant validate NOT run\n'
    VAGRANT=no
fi

# No version check against HashiCorp's servers, and Vagrant's per-project
# state (.vagrant/) in a scratch folder rather than the checkout.
export VAGRANT_CHECKPOINT_DISABLE=1
scratch=$(mktemp -d /tmp/kvprof-vm-check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export VAGRANT_DOTFILE_PATH=$scratch/dot-vagrant

if [[ $VAGRANT == no ]]; then
    :
elif vagrant plugin list 2>/dev/null | grep -q '^vagrant-libvirt '; then
    printf 'vm-check: vagrant validate (with vagrant-libvirt: the libvirt block is checked too)\n'
    vagrant validate
else
    printf 'vm-check: vagrant validate -p (no provider plugin installed: provider blocks not checked)\n'
    vagrant validate -p
fi

scripts=()
while IFS= read -r -d '' f; do
    [[ -f $f ]] || continue
    case "$f" in
        *.sh) scripts+=("$f") ;;
        *) if head -n 1 "$f" 2>/dev/null | grep -qE '^#!.*(/|env +|busybox +)(ba|da)?sh( |$)'; then scripts+=("$f"); fi ;;
    esac
done < <(git ls-files -z --cached --others --exclude-standard 2>/dev/null ||
    find . -path ./.git -prune -o -path ./.venv -prune -o -path ./build -prune -o -type f -print0)
[[ ${#scripts[@]} -gt 0 ]] || die "found no shell scripts to check"
printf 'vm-check: shellcheck -S warning on %d scripts: %s\n' "${#scripts[@]}" "${scripts[*]}"
shellcheck -S warning "${scripts[@]}"
printf 'vm-check: ok\n'
