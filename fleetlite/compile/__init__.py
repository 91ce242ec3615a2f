"""The compiler, the pass contract the passes in strategies/ implement, and program edits."""
