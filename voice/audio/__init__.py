"""Audio I/O: the device interface, the playback buffer with its cursor, the
live sounddevice stream and the replay device on a virtual clock."""
