"""The trio runtime: sockets, files and time. It executes the core's effects and decides
nothing itself."""
