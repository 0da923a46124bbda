"""The daemon: service lifecycle, control socket, doctor, ACP bridge."""
