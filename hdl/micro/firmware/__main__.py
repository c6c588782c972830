from . import BOOT_IMAGE, IMAGE, build

firmware, boot = build()
print(f"{IMAGE}: {len(firmware)} bytes; {BOOT_IMAGE}: {len(boot)} bytes")
