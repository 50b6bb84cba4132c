"""_producer"""
