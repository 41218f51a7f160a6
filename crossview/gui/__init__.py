"""The desktop app (PySide6). The only package that imports Qt; it holds no training or retrieval logic."""
