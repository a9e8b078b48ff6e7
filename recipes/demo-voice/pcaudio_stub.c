/* Stand-in for libpcaudio.so.0 (audio playback), for espeak-ng writing WAV
 * files only (-w). The real library pulls in PulseAudio and ALSA, about 20
 * more packages that a GPU machine without a package registry lacks; espeak-ng
 * never opens an audio device when it writes to a file, so none of these
 * functions is reached there. If one is, it fails the way "no device" does. */
#include <stddef.h>

struct audio_object;

struct audio_object *create_audio_device_object(const char *device, const char *application,
                                                const char *description) {
    (void)device; (void)application; (void)description;
    return NULL;
}
int audio_object_open(struct audio_object *o, int format, unsigned int rate, unsigned char channels) {
    (void)o; (void)format; (void)rate; (void)channels;
    return -1;
}
void audio_object_close(struct audio_object *o) { (void)o; }
void audio_object_destroy(struct audio_object *o) { (void)o; }
int audio_object_write(struct audio_object *o, const void *data, size_t bytes) {
    (void)o; (void)data; (void)bytes;
    return -1;
}
int audio_object_drain(struct audio_object *o) { (void)o; return -1; }
int audio_object_flush(struct audio_object *o) { (void)o; return -1; }
const char *audio_object_strerror(struct audio_object *o, int error) {
    (void)o; (void)error;
    return "no audio device (libpcaudio stand-in; espeak-ng can only write files here)";
}
