"""The harness beneath the recipe: each module one concern (harness/README.md). Nothing here imports a recipe file."""
