# shellcheck shell=sh
# Write DEST atomically from stdin (the text, base64 on one line): decoded into DEST.gpunode-new
# (made for its owner only), given OWNER and MODE, then renamed over DEST; DEST's directory is
# created if missing. A reader sees the old file or the new one, never a part. A directory at
# DEST is never written into: the rename fails instead.
# Usage: sh -c "$script" gpunode-write DEST OWNER MODE < base64-text
# Exit status: 0 when DEST holds the text; non-zero (DEST unchanged) otherwise.
dest=$1
temp="$dest.gpunode-new"
mkdir -p "$(dirname "$dest")" &&
    rm -f "$temp" &&
    (umask 077 && base64 -d > "$temp") &&
    chown "$2" "$temp" &&
    chmod "$3" "$temp" &&
    mv -fT "$temp" "$dest"
