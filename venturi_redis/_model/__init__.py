"""_model"""
