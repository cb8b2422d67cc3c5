# shellcheck shell=bash
# Sourced by the install scripts: root or sudo, Debian's packages installed once, and the check that skips a script
# whose commands are all there already.

export PATH="$PATH:/usr/sbin:/sbin" DEBIAN_FRONTEND=noninteractive
sudo=()
[[ $(id -u) -eq 0 ]] || sudo=(sudo)

# exit_if_present WHAT COMMAND...: exits the script (0) saying "WHAT already installed" when every command is found;
# otherwise says which are missing and returns.
exit_if_present() {
  local what=$1 missing=()
  shift
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "$what already installed"
    exit 0
  fi
  echo "installing (missing: ${missing[*]})"
}

# apt_install PACKAGE...: the packages not installed yet, from Debian's archive; the index is refreshed only when a
# package is not found (others may be installing at the same time: apt waits for its lock).
apt_install() {
  local missing=() apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=900)
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "installing ${missing[*]}"
  if ! "${apt[@]}" install -y --no-install-recommends "${missing[@]}"; then
    "${apt[@]}" update
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
  fi
}
