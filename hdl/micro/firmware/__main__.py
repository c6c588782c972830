from . import IMAGE, build

image = build()
print(f"{IMAGE}: {len(image)} bytes")
