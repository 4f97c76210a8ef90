"""What both benchmark wings use: statistics over seeds, the code version of a published figure, and the
marked blocks of a page that a generator rewrites."""
