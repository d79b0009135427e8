from hello import greet

assert greet("layerfs") == "Hello, layerfs!", greet("layerfs")
print("ok")
