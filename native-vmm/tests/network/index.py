"""A package index of one pure-Python wheel, for the egress tests (tests/network_kvm.rs).

usage: index.py DIR NAME VERSION SOURCE

Writes DIR/packages/NAME-VERSION-py3-none-any.whl (one module, NAME.py, whose text is SOURCE,
with its dist-info: METADATA, WHEEL, RECORD) and DIR/simple/NAME/index.html, the PEP 503 page
that links to it with its sha256.
"""
import base64
import hashlib
import pathlib
import sys
import zipfile

root, name, version, source = pathlib.Path(sys.argv[1]), *sys.argv[2:]
info = f"{name}-{version}.dist-info"
members = {
    f"{name}.py": source.encode(),
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: index.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


record = "".join(f"{path},{digest(data)},{len(data)}\n" for path, data in members.items())
members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()

wheel = root / "packages" / f"{name}-{version}-py3-none-any.whl"
wheel.parent.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel, "w") as archive:
    for path, data in members.items():
        archive.writestr(path, data)
page = root / "simple" / name / "index.html"
page.parent.mkdir(parents=True, exist_ok=True)
sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
page.write_text(f'<a href="../../packages/{wheel.name}#sha256={sha256}">{wheel.name}</a>\n')
