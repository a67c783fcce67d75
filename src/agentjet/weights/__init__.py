"""Weight I/O: how weights and checkpoints are laid out on disk, for every writer and reader of them."""
