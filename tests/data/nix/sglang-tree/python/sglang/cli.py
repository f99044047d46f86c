def main():
    from sglang import __version__
    print(__version__)
