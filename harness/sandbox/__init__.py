"""The rank sandbox: what a rank may reach (files, /proc, IPC), enforced by the kernel."""
