"""slime's import names, answered by slime_like (slime_like/utils/slime_names.py explains; docs/guide.md "Bringing
slime code" lists what is provided and refused). Nothing here is a copy of slime's code."""
PROVIDED_BY = "slime_like"
