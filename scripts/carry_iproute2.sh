#!/usr/bin/env bash
# Puts this machine's iproute2 `ip` and the libraries it loads into
# .carry/iproute2/ (ignored by git), for scripts/two_host_netns.sh on a GPU
# machine whose image lacks iproute2: name .carry in the device call's carry.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v ip > /dev/null || { sudo apt-get install -y iproute2 || apt-get install -y iproute2; }
dest=.carry/iproute2
rm -rf "$dest"
mkdir -p "$dest"
bin=$(readlink -f "$(command -v ip)")
cp "$bin" "$dest/ip"
# its libraries, but not the C library and the loader, which the other machine has
ldd "$bin" | awk '/=> \// {print $3}' | grep -vE '/(libc|ld-linux[^/]*)\.so' | while read -r lib; do
    cp -L "$lib" "$dest/"
done
echo "$(ls "$dest" | wc -l) files in $dest ($(du -sh "$dest" | cut -f1)); carry .carry to the GPU machine"
