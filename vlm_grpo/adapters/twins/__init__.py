
"""One module per family beside `adapters/families/`: the family's offline builders (the tiny twin's sizes, the
real-size presets, and `build`: the family's real classes with random weights and a locally built tokenizer).

Each module holds one twin class that its family's adapter mixes in (`class FooAdapter(FooTwin, VLMAdapter)`), so
`FooAdapter.tiny()`, `.preset(name)`, `.build(arch)`, `.presets` and `.tiny_architecture` are the adapter's own; the
registry discovers the family files only. A twin module imports no family file (the adapter imports its twin).
"""
