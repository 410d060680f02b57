# Sourced by tools/install_*.sh: install system packages as root, or with sudo without a password.
#   install_packages <caller> <package...>
# Uses apt-get, dnf or pacman, whichever this system has; exits 1 with a message naming the packages to ask
# an administrator for when it cannot install. CI runs as root (or with passwordless sudo).

install_packages() {
  local who=$1 sudo
  shift
  if [ "$(id -u)" = 0 ]; then
    sudo=
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    echo "$who: this user can neither install packages (not root) nor use sudo without a password;" >&2
    echo "  ask an administrator for: apt-get install $*" >&2
    exit 1
  fi
  echo "$who: installing $*"
  if command -v apt-get >/dev/null; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  elif command -v dnf >/dev/null; then
    $sudo dnf install -y -q "$@"
  elif command -v pacman >/dev/null; then
    $sudo pacman -S --noconfirm --needed "$@"
  else
    echo "$who: there is no apt-get, dnf or pacman here; install $* with this system's package manager" >&2
    exit 1
  fi
}
