# shellcheck shell=sh
# Print the NVIDIA Container Toolkit on the node, each part after a line MARK<name>:
#   ctk       nvidia-ctk --version's first line
#   ctk_path  the nvidia-ctk on PATH
#   packages  the installed PACKAGE... in dpkg-query FORMAT
#   runtime   the nvidia-container-runtime on PATH
#   keyring   the fingerprints of the primary keys in KEYRING, one a line (subkeys not listed), read
#             with gpg in a throwaway home, so the node's own ~/.gnupg is not created
#   list      last: the text of the apt source LIST (absent without it)
# Usage: sh -c "$script" gpunode-container-toolkit MARK FORMAT KEYRING LIST PACKAGE...
# Exit status: 0.
mark=$1 format=$2 keyring=$3 list=$4
shift 4
echo "${mark}ctk"
if command -v nvidia-ctk >/dev/null 2>&1; then nvidia-ctk --version 2>/dev/null | head -n 1; fi
echo "${mark}ctk_path"
command -v nvidia-ctk
echo "${mark}packages"
dpkg-query -W -f="$format" "$@" 2>/dev/null
echo "${mark}runtime"
command -v nvidia-container-runtime
echo "${mark}keyring"
if [ -f "$keyring" ] && command -v gpg >/dev/null 2>&1; then
    gpghome=$(mktemp -d) && {
        gpg --homedir "$gpghome" --batch --show-keys --with-colons "$keyring" 2>/dev/null |
            awk -F: '$1 == "pub" {want = 1} $1 == "sub" {want = 0} $1 == "fpr" && want {print $10; want = 0}'
        rm -rf "$gpghome"
    }
fi
if [ -f "$list" ]; then
    echo "${mark}list"
    cat "$list"
fi
exit 0
