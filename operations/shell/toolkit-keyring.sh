# shellcheck shell=sh
# Write exactly the key FINGERPRINT from the key file at URL to KEYRING (root's, mode 644).
# Usage: sh -c "$script" gpunode-keyring FINGERPRINT URL KEYRING
# The key file is imported into a throwaway gpg home and only the pinned key is exported from it,
# so other keys in the file never reach the keyring; it fails naming what the file holds when the
# pinned key is not among them.
set -e
fingerprint=$1
url=$2
keyring=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -m 700 "$tmp/gnupg"

# The primary keys' fingerprints in the key file $1, one a line (subkeys not listed), read with a
# throwaway gpg home.
primary_fingerprints() {
    gpghome=$(mktemp -d) && {
        gpg --homedir "$gpghome" --batch --show-keys --with-colons "$1" 2>/dev/null |
            awk -F: '$1 == "pub" {want = 1} $1 == "sub" {want = 0} $1 == "fpr" && want {print $10; want = 0}'
        rm -rf "$gpghome"
    }
}

curl -fsSL "$url" -o "$tmp/key"
gpg --homedir "$tmp/gnupg" --batch --quiet --import "$tmp/key"
gpg --homedir "$tmp/gnupg" --batch --export --export-options export-minimal "$fingerprint" >"$tmp/keyring.gpg"
found=$(primary_fingerprints "$tmp/keyring.gpg")
if [ "$found" != "$fingerprint" ]; then
    echo "toolkit repository key file $url holds no key $fingerprint (it holds: $(primary_fingerprints "$tmp/key" | xargs))" >&2
    exit 1
fi
install -m 644 -o root -g root "$tmp/keyring.gpg" "$keyring.tmp"
mv "$keyring.tmp" "$keyring"
