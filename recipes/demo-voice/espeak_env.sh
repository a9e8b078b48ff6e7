# Source me: unpack espeak-ng from the .deb files in DEB_DIR into a private
# prefix (no dpkg database, no root needed) and point the environment at it.
#   . recipes/demo-voice/espeak_env.sh [DEB_DIR=.deb] [PREFIX=/tmp/espeak]
# Afterwards "$ESPEAK" is the binary to pass to make_data.py --espeak.
# libpcaudio (audio playback, which pulls in PulseAudio and ALSA) is replaced
# by pcaudio_stub.c: espeak-ng -w never plays audio. A prebuilt stub in
# DEB_DIR/libpcaudio.so.0 is used when this machine has no C compiler.
_deb_dir=${1:-.deb}
_prefix=${2:-/tmp/espeak}
_here=$(dirname "${BASH_SOURCE[0]}")
mkdir -p "$_prefix"
for _f in "$_deb_dir"/espeak-ng_*.deb "$_deb_dir"/espeak-ng-data_*.deb \
          "$_deb_dir"/libespeak-ng1_*.deb "$_deb_dir"/libsonic0_*.deb; do
    dpkg -x "$_f" "$_prefix" || return 1
done
_lib="$_prefix/usr/lib/x86_64-linux-gnu"
if command -v gcc >/dev/null; then
    gcc -shared -fPIC -O2 -Wl,-soname,libpcaudio.so.0 -o "$_lib/libpcaudio.so.0" "$_here/pcaudio_stub.c" || return 1
else
    cp "$_deb_dir/libpcaudio.so.0" "$_lib/" || return 1
fi
export LD_LIBRARY_PATH="$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ESPEAK_DATA_PATH="$_lib/espeak-ng-data"
export ESPEAK="$_prefix/usr/bin/espeak-ng"
"$ESPEAK" --version
